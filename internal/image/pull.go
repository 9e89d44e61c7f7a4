package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// ErrRegistry wraps failures to talk to a registry (unreachable, refused,
// server errors) as opposed to bad references or missing images.
var ErrRegistry = errors.New("registry error")

// PullOptions tune Pull; the zero value is right for production.
type PullOptions struct {
	// Keychain resolves credentials; default authn.DefaultKeychain (the
	// docker config: ~/.docker/config.json, $DOCKER_CONFIG, cred helpers).
	Keychain authn.Keychain
	// Transport is the HTTP transport; default remote.DefaultTransport.
	Transport http.RoundTripper
}

// Pull fetches ref ("registry/repo:tag" or "registry/repo@sha256:...") for
// linux/amd64 and stores it as name (ref when empty). Each layer is
// converted to EROFS as it arrives; layers the store has are not fetched;
// concurrent pulls of one layer in this process fetch it once. A digest in
// ref pins the manifest; every blob is checked against its digest and every
// layer against the config's diff id.
func (s *LocalStore) Pull(ctx context.Context, ref, as string) (*Image, error) {
	return s.PullWith(ctx, ref, as, PullOptions{})
}

// PullWith is Pull with options.
func (s *LocalStore) PullWith(ctx context.Context, ref, as string, o PullOptions) (*Image, error) {
	if ref == "" {
		return nil, fmt.Errorf("%w: ref is required", ErrInvalid)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: reference %q: %v", ErrInvalid, trunc(ref), err)
	}
	if as == "" {
		as = ref
	}
	if err := ValidName(as); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if o.Keychain == nil {
		o.Keychain = authn.DefaultKeychain
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(o.Keychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}),
		remote.WithRetryBackoff(remote.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 4}),
	}
	if o.Transport != nil {
		opts = append(opts, remote.WithTransport(o.Transport))
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, registryErr(ref, err)
	}
	cfg, srcs, err := imageSources(img)
	if err != nil {
		return nil, registryErr(ref, err)
	}
	out, err := s.importLayers(ctx, as, cfg, srcs)
	if err != nil {
		return nil, registryErr(ref, err)
	}
	return out, nil
}

// registryErr classifies a pull failure.
func registryErr(ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		if te.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s: %v", ErrNotFound, ref, err)
		}
		if te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden {
			return fmt.Errorf("%w: pull %s: access denied (credentials come from the docker config): %v", ErrRegistry, ref, err)
		}
		return fmt.Errorf("%w: pull %s: %v", ErrRegistry, ref, err)
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, ErrRegistry) {
		return fmt.Errorf("%w: pull %s: %v", ErrRegistry, ref, err)
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrBadContent) || errors.Is(err, ErrNoSpace) {
		return err
	}
	return fmt.Errorf("%w: pull %s: %v", ErrBadContent, ref, err)
}
