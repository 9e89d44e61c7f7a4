package edge

import (
	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// The wire between the apiserver and the edges lives in internal/edgeproto
// (the ingress imports it, never this package); these aliases keep the
// edge's own code reading as before.

// Operations an edge answers on its bus subject (bus.EdgeSubject(node).<op>).
const (
	OpCreate      = edgeproto.OpCreate
	OpGet         = edgeproto.OpGet
	OpList        = edgeproto.OpList
	OpDelete      = edgeproto.OpDelete
	OpExec        = edgeproto.OpExec
	OpCommandGet  = edgeproto.OpCommandGet
	OpCommandKill = edgeproto.OpCommandKill
	OpFileRead    = edgeproto.OpFileRead
	OpFileWrite   = edgeproto.OpFileWrite
	OpFileList    = edgeproto.OpFileList
	OpFileStat    = edgeproto.OpFileStat
	OpFileMkdir   = edgeproto.OpFileMkdir
	OpFileRemove  = edgeproto.OpFileRemove
	OpFileRename  = edgeproto.OpFileRename
	OpTarGet      = edgeproto.OpTarGet
	OpTarPut      = edgeproto.OpTarPut
	OpImages      = edgeproto.OpImages
	OpImagePull   = edgeproto.OpImagePull
	OpImageCommit = edgeproto.OpImageCommit
	OpLayerCreate = edgeproto.OpLayerCreate
	OpPause       = edgeproto.OpPause
	OpResume      = edgeproto.OpResume
	OpTimeout     = edgeproto.OpTimeout
	OpPauseMatch  = edgeproto.OpPauseMatch
	OpPoolPut     = edgeproto.OpPoolPut
	OpPoolList    = edgeproto.OpPoolList
	OpPoolDelete  = edgeproto.OpPoolDelete
	OpFnCall      = edgeproto.OpFnCall
	OpLayerUpload = edgeproto.OpLayerUpload
	OpLayerList   = edgeproto.OpLayerList
	OpLayerGet    = edgeproto.OpLayerGet
	OpLayerDelete = edgeproto.OpLayerDelete
	OpLayerGC     = edgeproto.OpLayerGC
	OpCreateBatch = edgeproto.OpCreateBatch
	OpSnapshot    = edgeproto.OpSnapshot
	OpSnapshotGet = edgeproto.OpSnapshotGet
	OpTrajResume  = edgeproto.OpTrajResume
	OpTrajReplay  = edgeproto.OpTrajReplay
	OpTrajAdvance = edgeproto.OpTrajAdvance
	OpAudit       = edgeproto.OpAudit
	OpCommands    = edgeproto.OpCommands
	OpStats       = edgeproto.OpStats
	OpNetwork     = edgeproto.OpNetwork
	OpNetworkSet  = edgeproto.OpNetworkSet
	// OpNetworkDenials answers a sandbox's denial log.
	OpNetworkDenials = edgeproto.OpNetworkDenials
	OpFileUpload     = edgeproto.OpFileUpload
	OpTarUpload      = edgeproto.OpTarUpload
	OpForkMemory     = edgeproto.OpForkMemory
)

// Request and answer bodies.
type (
	NetworkSetRequest    = edgeproto.NetworkSetRequest
	LayerRequest         = edgeproto.LayerRequest
	UploadResult         = edgeproto.UploadResult
	CreateBatchRequest   = edgeproto.CreateBatchRequest
	CreateBatchResult    = edgeproto.CreateBatchResult
	CreateBatchItem      = edgeproto.CreateBatchItem
	PoolNameRequest      = edgeproto.PoolNameRequest
	PauseMatchingRequest = edgeproto.PauseMatchingRequest
	CreateRequest        = edgeproto.CreateRequest
	IDRequest            = edgeproto.IDRequest
	TimeoutRequest       = edgeproto.TimeoutRequest
	ResumeSandboxRequest = edgeproto.ResumeSandboxRequest
	ListRequest          = edgeproto.ListRequest
	ExecRequest          = edgeproto.ExecRequest
	CommandRequest       = edgeproto.CommandRequest
	FileRequest          = edgeproto.FileRequest
	TarPutResult         = edgeproto.TarPutResult
	SnapshotRequest      = edgeproto.SnapshotRequest
	SnapshotGetRequest   = edgeproto.SnapshotGetRequest
	AuditRequest         = edgeproto.AuditRequest
	FnCallRequest        = edgeproto.FnCallRequest
	ResumeRequest        = edgeproto.ResumeRequest
	AdvanceRequest       = edgeproto.AdvanceRequest
	StepResult           = edgeproto.StepResult
	ReplayRequest        = edgeproto.ReplayRequest
	TrajectoryRecord     = edgeproto.TrajectoryRecord
	ReplayFilter         = edgeproto.ReplayFilter
	ForkMemoryRequest    = edgeproto.ForkMemoryRequest
	ForkMemoryResult     = edgeproto.ForkMemoryResult
)

// Limits, ids and checks shared with the apiserver.
const (
	MaxLayerUpload = edgeproto.MaxLayerUpload
	MaxPoolSize    = edgeproto.MaxPoolSize
)

// DataOps are the operations the data listener serves: those that stream.
var DataOps = edgeproto.DataOps

// ValidNodeName reports whether name can be a node name.
func ValidNodeName(name string) bool { return edgeproto.ValidNodeName(name) }

// NodeOf extracts the node name from a sandbox id, or "" if id is malformed.
func NodeOf(id string) string { return edgeproto.NodeOf(id) }

// NewSandboxID makes a fresh id for node.
func NewSandboxID(node string) string { return edgeproto.NewSandboxID(node) }

// LostReason is the reason of a sandbox reported lost with its node.
func LostReason(node string) string { return edgeproto.LostReason(node) }

// SnapshotLayerName is the named layer that holds a snapshot's diff.
func SnapshotLayerName(id string) string { return edgeproto.SnapshotLayerName(id) }

// TrajKey is where the record and the log of project's trajectory name
// are stored.
func TrajKey(project, name string) string { return edgeproto.TrajKey(project, name) }

// NewReplayFilter checks and compiles a replay's masks and ignored fields.
func NewReplayFilter(masks, ignore []string) (*ReplayFilter, error) {
	return edgeproto.NewReplayFilter(masks, ignore)
}

func sameOp(a, b *api.TrajectoryStep) bool { return edgeproto.SameOp(a, b) }

// NormalizeFnCall validates a task and fills in defaults; it returns the
// sandbox shape its worker has.
func NormalizeFnCall(c *api.FnCallRequest) (api.CreateSandboxRequest, *api.Error) {
	return edgeproto.NormalizeFnCall(c)
}

// PoolSpec turns a pool request into the create request its members are
// made with, validated and normalized.
func PoolSpec(r *api.PoolRequest) (api.CreateSandboxRequest, *api.Error) {
	return edgeproto.PoolSpec(r)
}

// SameOp reports whether a re-issued operation equals the logged one.
func SameOp(a, b *api.TrajectoryStep) bool { return edgeproto.SameOp(a, b) }

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
