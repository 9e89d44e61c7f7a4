package edge

// A file's upload over the data plane (OpFileUpload) is
// internal/edge/upload's (its package comment; imported as fileupload,
// for layers.go's upload is a layer's). The core finds the sandbox for it
// (uploadHost) and hands it over as an upload.Sandbox (uploadSandbox):
// its agent through acquire, its file operations through fileRecorded
// (recorded in a trajectory sandbox), the answer through file.

import (
	"context"
	"io"

	"github.com/warrenhq/warren/api"
	fileupload "github.com/warrenhq/warren/internal/edge/upload"
)

// uploadFile answers OpFileUpload: req.Path written from in.
func (e *Edge) uploadFile(ctx context.Context, req *FileRequest, in io.Reader) (any, error) {
	fi, err := fileupload.File(ctx, uploadHost{e}, req.ID, req.Path, req.Mode, in)
	if err != nil {
		return nil, err
	}
	return fi, nil
}

// uploadHost is the core as an upload sees it.
type uploadHost struct{ e *Edge }

var _ fileupload.Host = uploadHost{}

func (h uploadHost) Lookup(id string) (fileupload.Sandbox, error) {
	sb, err := h.e.lookup(id)
	if err != nil {
		return nil, err
	}
	return uploadSandbox{sb: sb, e: h.e, id: id}, nil
}

// uploadSandbox is sb as an upload sees it; id is the sandbox's id as the
// upload names it.
type uploadSandbox struct {
	sb *sandbox
	e  *Edge
	id string
}

var _ fileupload.Sandbox = uploadSandbox{}

func (s uploadSandbox) Wait()                      { <-s.sb.ready }
func (s uploadSandbox) Recorded() bool             { return s.sb.traj != nil }
func (s uploadSandbox) AgentError(err error) error { return s.e.agentError(s.sb, err) }

func (s uploadSandbox) Acquire() (fileupload.Agent, func(), error) {
	_, agent, release, err := s.e.acquire(s.id)
	if err != nil {
		return nil, nil, err
	}
	return agent, release, nil
}

func (s uploadSandbox) Record(ctx context.Context, w *fileupload.Write) error {
	_, err := s.e.fileRecorded(ctx, OpFileWrite, &FileRequest{ID: s.id, Path: w.Path, Mode: w.Mode, Data: w.Data, Append: w.Append}, nil)
	return err
}

func (s uploadSandbox) Remove(ctx context.Context, path string) error {
	_, err := s.e.fileRecorded(ctx, OpFileRemove, &FileRequest{ID: s.id, Path: path}, nil)
	return err
}

func (s uploadSandbox) Rename(ctx context.Context, from, to string) error {
	_, err := s.e.fileRecorded(ctx, OpFileRename, &FileRequest{ID: s.id, Path: from, To: to}, nil)
	return err
}

func (s uploadSandbox) Stat(ctx context.Context, path string) (*api.FileInfo, error) {
	out, err := s.e.file(ctx, OpFileStat, &FileRequest{ID: s.id, Path: path}, nil)
	if err != nil {
		return nil, err
	}
	fi, _ := out.(*api.FileInfo)
	return fi, nil
}
