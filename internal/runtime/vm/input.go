package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/warrenhq/warren/internal/runtime"
)

// MaxText is the most characters one text input types.
const MaxText = 4096

// absMax is the top of QEMU's absolute pointer axes (INPUT_EVENT_ABS_MAX).
const absMax = 0x7fff

// plainKeys are the QEMU key names of the characters typed without shift,
// shiftedKeys those typed with it (a US keyboard layout).
var plainKeys = map[rune]string{
	' ': "spc", '\n': "ret", '\t': "tab", '-': "minus", '=': "equal", '[': "bracket_left", ']': "bracket_right",
	';': "semicolon", '\'': "apostrophe", '`': "grave_accent", '\\': "backslash", ',': "comma", '.': "dot", '/': "slash",
}

var shiftedKeys = map[rune]string{
	'!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6", '&': "7", '*': "8", '(': "9", ')': "0",
	'_': "minus", '+': "equal", '{': "bracket_left", '}': "bracket_right", ':': "semicolon", '"': "apostrophe",
	'~': "grave_accent", '|': "backslash", '<': "comma", '>': "dot", '?': "slash",
}

// qcode is QEMU's key called name.
func qcode(name string) (raw.KeyValue, error) {
	var k raw.QKeyCode
	if err := json.Unmarshal([]byte(fmt.Sprintf("%q", name)), &k); err != nil {
		return nil, fmt.Errorf("%w: unknown key %q (QEMU's key names: a, ret, spc, ctrl, alt, delete, f1, …)", runtime.ErrBadInput, name)
	}
	return raw.KeyValueQcode(k), nil
}

// keysOf are the keys that type r (shift first when it needs it).
func keysOf(r rune) ([]raw.KeyValue, error) {
	var names []string
	switch {
	case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		names = []string{string(r)}
	case r >= 'A' && r <= 'Z':
		names = []string{"shift", string(r - 'A' + 'a')}
	case plainKeys[r] != "":
		names = []string{plainKeys[r]}
	case shiftedKeys[r] != "":
		names = []string{"shift", shiftedKeys[r]}
	default:
		return nil, fmt.Errorf("%w: %q cannot be typed (printable ASCII, tab and newline only)", runtime.ErrBadInput, r)
	}
	return combo(names)
}

func combo(names []string) ([]raw.KeyValue, error) {
	keys := make([]raw.KeyValue, len(names))
	for i, n := range names {
		k, err := qcode(n)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	return keys, nil
}

// SendInput sends one input event to h's screen.
func (r *Runtime) SendInput(ctx context.Context, h runtime.Handle, in runtime.DisplayInput) error {
	if _, err := vncPath(h); err != nil {
		return err
	}
	switch in.Type {
	case "text":
		if in.Text == "" || len([]rune(in.Text)) > MaxText {
			return fmt.Errorf("%w: text must have 1 to %d characters", runtime.ErrBadInput, MaxText)
		}
		var seq [][]raw.KeyValue
		for _, c := range in.Text {
			keys, err := keysOf(c)
			if err != nil {
				return err
			}
			seq = append(seq, keys)
		}
		return r.QMP(h, func(m *raw.Monitor) error {
			for _, keys := range seq {
				if err := m.SendKey(keys, nil); err != nil {
					return err
				}
			}
			return nil
		})
	case "key":
		if in.Key == "" || len(in.Key) > 100 {
			return fmt.Errorf("%w: key must name keys joined by '-', e.g. ctrl-alt-delete", runtime.ErrBadInput)
		}
		keys, err := combo(strings.Split(in.Key, "-"))
		if err != nil {
			return err
		}
		return r.QMP(h, func(m *raw.Monitor) error { return m.SendKey(keys, nil) })
	case "click":
		return r.click(h, in.X, in.Y)
	}
	return fmt.Errorf("%w: type must be text, key or click, not %q", runtime.ErrBadInput, in.Type)
}

// click moves the tablet's pointer to pixel x, y of the screen and clicks
// its left button.
func (r *Runtime) click(h runtime.Handle, x, y int) error {
	w, ht, err := r.size(h)
	if err != nil {
		return err
	}
	if x < 0 || y < 0 || x >= w || y >= ht {
		return fmt.Errorf("%w: click at %d,%d is off the %dx%d screen", runtime.ErrBadInput, x, y, w, ht)
	}
	scale := func(v, n int) int64 {
		if n <= 1 {
			return 0
		}
		return int64(v) * absMax / int64(n-1)
	}
	move := []raw.InputEvent{
		raw.InputEventAbs{Axis: raw.InputAxisX, Value: scale(x, w)},
		raw.InputEventAbs{Axis: raw.InputAxisY, Value: scale(y, ht)},
	}
	return r.QMP(h, func(m *raw.Monitor) error {
		if err := m.InputSendEvent(nil, nil, move); err != nil {
			return err
		}
		for _, down := range []bool{true, false} {
			if err := m.InputSendEvent(nil, nil, []raw.InputEvent{raw.InputEventBtn{Button: raw.InputButtonLeft, Down: down}}); err != nil {
				return err
			}
		}
		return nil
	})
}

// size is the screen's size in pixels.
func (r *Runtime) size(h runtime.Handle) (int, int, error) {
	img, err := r.dump(h)
	if err != nil {
		return 0, 0, err
	}
	return img.Bounds().Dx(), img.Bounds().Dy(), nil
}
