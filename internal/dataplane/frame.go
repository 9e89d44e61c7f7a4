package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame kinds. A frame is one kind byte, a 4-byte big-endian length and
// that many bytes.
const (
	kindStdout = 'o'
	kindStderr = 'e'
	kindData   = 'd'
	kindEOF    = 'f' // a stream's output ended (its input may go on): the "eof" stream
	kindDone   = 'k' // the JSON result; the last frame
	kindError  = 'x' // a JSON api.Error; the last frame
)

// maxFrame bounds one frame (a chunk is at most 256 KiB; a result is JSON).
const maxFrame = 16 << 20

// ErrBroken is a stream that ended before its last frame.
var ErrBroken = errors.New("dataplane: stream broken before its end")

func streamKind(stream string) byte {
	switch stream {
	case "stdout":
		return kindStdout
	case "stderr":
		return kindStderr
	case "eof":
		return kindEOF
	}
	return kindData
}

func kindStream(k byte) string {
	switch k {
	case kindStdout:
		return "stdout"
	case kindStderr:
		return "stderr"
	case kindEOF:
		return "eof"
	}
	return "data"
}

// writeFrame writes one frame.
func writeFrame(w io.Writer, kind byte, b []byte) error {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(b)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	_, err := w.Write(b)
	return err
}

// readFrame reads one frame into buf (grown as needed). An end of the
// body where a frame should start, or inside one, is ErrBroken: only the
// done and error frames end a stream.
func readFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, broken(err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("dataplane: frame of %d bytes exceeds %d", n, maxFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, broken(err)
	}
	return hdr[0], buf, nil
}

func broken(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrBroken
	}
	return fmt.Errorf("%w: %w", ErrBroken, err)
}

// ReadChunk fills buf from an upload r. Unlike io.ReadFull it keeps what
// r says: io.EOF (with the last bytes) only at the upload's clean end, and
// io.ErrUnexpectedEOF (a body cut short: its sender went away) as the
// error it is, never as a short last piece.
func ReadChunk(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Input frames. The upload of a call with live input (a terminal, or a
// command whose stdin stays open) is a sequence of frames in the same
// format, each one thing for the command, in order: bytes for its stdin
// (InputData), a new terminal size (InputResize, JSON {"cols","rows"}), a
// signal for its process group (InputSignal, JSON {"signal":N}), the end
// of its stdin (InputEOF, no bytes). The upload's clean end (between
// frames) means no more input; the command goes on.
const (
	InputData   = 'i'
	InputResize = 'r'
	InputSignal = 's'
	InputEOF    = 'c'
)

// MaxInputFrame bounds one input frame.
const MaxInputFrame = 1 << 20

// WriteInput writes one input frame.
func WriteInput(w io.Writer, kind byte, b []byte) error {
	if len(b) > MaxInputFrame {
		return fmt.Errorf("dataplane: input frame of %d bytes exceeds %d", len(b), MaxInputFrame)
	}
	return writeFrame(w, kind, b)
}

// ReadInput reads one input frame into buf (grown as needed): io.EOF at
// the upload's clean end, ErrBroken for one that ends inside a frame or
// whose sender went away.
func ReadInput(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	n, err := io.ReadFull(r, hdr[:])
	if n == 0 && errors.Is(err, io.EOF) {
		return 0, nil, io.EOF
	}
	if err != nil {
		return 0, nil, broken(err)
	}
	size := binary.BigEndian.Uint32(hdr[1:])
	if size > MaxInputFrame {
		return 0, nil, fmt.Errorf("dataplane: input frame of %d bytes exceeds %d", size, MaxInputFrame)
	}
	switch hdr[0] {
	case InputData, InputResize, InputSignal, InputEOF:
	default:
		return 0, nil, fmt.Errorf("dataplane: input frame of unknown kind %q", hdr[0])
	}
	if cap(buf) < int(size) {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, broken(err)
	}
	return hdr[0], buf, nil
}
