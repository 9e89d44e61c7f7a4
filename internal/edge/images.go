package edge

import (
	"context"
	"errors"
	"os"

	"github.com/warrenhq/warren/api"
)

// The node's image and layer store (internal/image), split by concern.
// Each part is an interface of its own so that a part of the edge, and a
// test's fake, needs only the concern it uses; ImageResolver, all of them,
// is what Config.Images takes (one store implements every part).
//
//	ImageCatalog   resolving images for sandboxes; the node view    create.go, loops.go, ops.go
//	ImageIntake    bringing images in: pull, import, commit, uploads ops.go, layers.go
//	LayerMounts    the node's shared read-only layer mounts         create.go, sandbox.go, recycle.go, snapshot.go, layers.go
//	LayerCatalog   named layers: look up, list, delete, GC, upload   layers.go
//	LayerPacker    packing a sandbox's writable layer into a layer   layers.go (layer_create), snapshot.go

// ResolvedImage is what a sandbox needs of its image.
type ResolvedImage struct {
	Digest string
	Layers []string // layer diff ids ("sha256:<hex>"), top-most first
	Env    []string // the image's KEY=VALUE environment
	// WorkingDir and User are the image's defaults for exec (the create
	// request's user wins over User).
	WorkingDir string
	User       string
	// Disk is the path of the image's VM disk (an image of the vm tier,
	// imported with `warren image import --disk`; it has no layers), "" for
	// an image of layers.
	Disk string
}

// ImageCatalog resolves the node's images.
type ImageCatalog interface {
	// ResolveLayers finds an image's layers; ErrImageNotFound for unknown
	// names.
	ResolveLayers(ctx context.Context, name string) (*ResolvedImage, error)
	ListImages(ctx context.Context) ([]api.Image, error)
}

// ImageIntake brings images into the node's store.
type ImageIntake interface {
	// PullImage fetches ref from its registry and stores it as name.
	PullImage(ctx context.Context, ref, name string) (*api.Image, error)
	// ImportImage stores the archive at path (OCI, docker-save or a root
	// filesystem tarball) as the image name.
	ImportImage(ctx context.Context, path, name string) (*api.Image, error)
	// ImportDisk validates the VM disk image at path (format "qcow2" or
	// "raw") and stores it as the image name of the vm tier; a file it
	// refuses is a 400.
	ImportDisk(ctx context.Context, path, name, format string) (*api.Image, error)
	// CommitImage stores an image made of a base image and named layers.
	CommitImage(ctx context.Context, req *api.CommitImageRequest) (*api.Image, error)
	// StageFile creates a private file for an upload (on the store's
	// filesystem).
	StageFile() (*os.File, error)
}

// LayerMounts mounts layers. Layers are mounted once per node and shared;
// each sandbox holds references that ReleaseLayers drops.
type LayerMounts interface {
	// MountLayers mounts the layers (diff ids) for holder and returns their
	// read-only directories in the same order.
	MountLayers(holder string, diffIDs []string) ([]string, error)
	// ReleaseLayers drops holder's references (idempotent).
	ReleaseLayers(holder string)
	// ReconcileMounts keeps exactly the mounts the given holders need.
	ReconcileMounts(holders map[string][]string) error
}

// LayerCatalog is the node's named layers. Errors are *api.Error where the
// caller is at fault.
type LayerCatalog interface {
	ResolveLayer(ctx context.Context, ref string) (*api.Layer, error)
	ListLayers(ctx context.Context, name string) ([]api.Layer, error)
	DeleteLayer(ctx context.Context, name string, version int) ([]api.Layer, error)
	CreateLayerFromTar(ctx context.Context, name string, version int, path string) (*api.Layer, error)
	GC(ctx context.Context) (*api.GCResult, error)
}

// LayerPacker packs a sandbox's writable layer into a named layer.
type LayerPacker interface {
	// CreateLayerFromChanges packs a sandbox's writable layer; idBase is
	// the host id of the sandbox's root (runtime.Handle.IDBase), whose
	// range is shifted back to the ids the sandbox saw.
	CreateLayerFromChanges(ctx context.Context, name string, version int, upper string, lowers []string, idBase uint32, source string) (*api.Layer, error)
	// CreateLayerFromPrivateChanges is the same for a copy of an upper
	// directory that nothing else uses: it may change it (faster).
	CreateLayerFromPrivateChanges(ctx context.Context, name string, version int, dir string, lowers []string, idBase uint32, source string) (*api.Layer, error)
}

// ImageResolver is the whole store, every concern above.
type ImageResolver interface {
	ImageCatalog
	ImageIntake
	LayerMounts
	LayerCatalog
	LayerPacker
}

// ErrImageNotFound is what an ImageResolver returns for unknown names.
var ErrImageNotFound = errors.New("image not found")

// WritableLayers hands out each sandbox's private writable directory with a
// disk limit.
type WritableLayers interface {
	Alloc(id string, limitBytes int64) (dir string, err error)
	Free(id string) error
	List() ([]string, error)
}
