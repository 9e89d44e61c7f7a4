package agent

import (
	"fmt"
	"os/exec"
	"path"
	"sort"
	"strings"
	"testing"
)

// bashQuote quotes like bash's `declare -x NAME="value"`.
func bashQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`")
	return `"` + r.Replace(s) + `"`
}

// ansiQuote quotes like bash 5.2's $'...' for values with control chars.
func ansiQuote(s string) string {
	var b strings.Builder
	b.WriteString("$'")
	for _, r := range []byte(s) {
		switch {
		case r == '\'' || r == '\\':
			b.WriteByte('\\')
			b.WriteByte(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\%03o`, r)
		default:
			b.WriteByte(r)
		}
	}
	b.WriteString("'")
	return b.String()
}

var samples = []string{"", "plain", "with space", "it's", `dq"uote`, "new\nline", `back\slash`, "$HOME `x` $(y)", "tab\tand\r", "ünïcödé", "'\"'\"'", "end\\", "a=b=c", "\n\n"}

func TestParseExportsStyles(t *testing.T) {
	for _, v := range samples {
		for style, line := range map[string]string{
			"dash":  "export V=" + shellQuote(v),
			"bash":  "declare -x V=" + bashQuote(v),
			"ansi":  "declare -x V=" + ansiQuote(v),
			"posix": "export V=" + bashQuote(v),
		} {
			text := "export A='1'\n" + line + "\ndeclare -x EMPTY\nexport Z=z\n"
			got := parseExports(text)
			if got["V"] != v || got["A"] != "1" || got["Z"] != "z" || len(got) != 3 {
				t.Errorf("%s %q: got %q", style, v, got)
			}
		}
	}
}

// TestParseExportsRealShells runs the shells installed here and parses what
// they print.
func TestParseExportsRealShells(t *testing.T) {
	for _, sh := range [][]string{{"dash"}, {"bash"}, {"bash", "--posix"}, {"busybox", "sh"}, {"zsh"}} {
		bin, err := exec.LookPath(sh[0])
		if err != nil {
			continue
		}
		args := append(sh[1:], "-c", "export -p")
		cmd := exec.Command(bin, args...)
		cmd.Env = nil
		for i, v := range samples {
			cmd.Env = append(cmd.Env, fmt.Sprintf("V%d=%s", i, v))
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v", sh, err)
		}
		got := parseExports(string(out))
		for i, v := range samples {
			if g := got[fmt.Sprintf("V%d", i)]; g != v {
				t.Errorf("%v: V%d = %q, want %q\n%s", sh, i, g, v, out)
			}
		}
	}
}

func FuzzParseExports(f *testing.F) {
	for _, s := range samples {
		f.Add("NAME", s)
	}
	f.Add("_x9", "$'\\x41\\u00e9\\101'")
	f.Fuzz(func(t *testing.T, name, value string) {
		// Never panics on arbitrary text.
		parseExports(name + value)
		parseExports("export " + name + "=" + value)
		if !validName(name) || name == "A" || name == "B" || strings.IndexByte(value, 0) >= 0 {
			return
		}
		for _, line := range []string{
			"export " + name + "=" + shellQuote(value),
			"declare -x " + name + "=" + bashQuote(value),
			"declare -rx " + name + "=" + ansiQuote(value),
		} {
			got := parseExports("export A=1\n" + line + "\nexport B='2'\n")
			if got[name] != value {
				t.Fatalf("%q: got %q want %q", line, got[name], value)
			}
			if got["A"] != "1" || got["B"] != "2" {
				t.Fatalf("%q: neighbours %q", line, got)
			}
		}
	})
}

func TestParseState(t *testing.T) {
	st, ok := parseState([]byte("3\x00/a b\x00export X='1\n2'\nexport Y=\x00"))
	if !ok || st.status != 3 || st.cwd != "/a b" || st.env["X"] != "1\n2" || st.env["Y"] != "" || len(st.env) != 2 {
		t.Fatalf("%v %+v", ok, st)
	}
	for _, bad := range []string{"0\x00/a\x00export X=1", "x\x00/\x00\x00", "300\x00/\x00\x00", "-1\x00/\x00\x00"} {
		if _, ok := parseState([]byte(bad)); ok {
			t.Fatalf("bad state %q accepted", bad)
		}
	}
}

func TestBuildScriptEnv(t *testing.T) {
	s, ok := buildScript(map[string]string{"A": "1", "GONE": "x"}, "/", map[string]string{"A": "1", "B": "it's"}, "/tmp", "echo hi")
	if !ok || !strings.Contains(s, "unset GONE\n") || !strings.Contains(s, "export B='it'\"'\"'s'\n") || strings.Contains(s, "export A") || !strings.Contains(s, "cd -- '/tmp'") {
		t.Fatalf("script:\n%s", s)
	}
	if _, ok := buildScript(nil, "/", map[string]string{"A-B": "1"}, "/", "true"); ok {
		t.Fatal("invalid name accepted")
	}
	keys := []string{}
	for k := range parseExports("export B='1'\nexport A='2'") {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "A,B" {
		t.Fatal(keys)
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "a", "", "/a/../../b", "/a\x00", "//x//", "/./.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := cleanPath(p)
		if err != nil {
			if strings.HasPrefix(p, "/") && !strings.Contains(p, "\x00") && len(p) <= 4096 {
				t.Fatalf("%q rejected: %v", p, err)
			}
			return
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "\x00") {
			t.Fatalf("%q accepted", p)
		}
		if !path.IsAbs(c) || path.Clean(c) != c || strings.Contains(c, "/../") || strings.HasSuffix(c, "/..") {
			t.Fatalf("%q cleaned to %q", p, c)
		}
		r := rel(c)
		if strings.HasPrefix(r, "/") || r == ".." || strings.HasPrefix(r, "../") {
			t.Fatalf("%q: relative form %q escapes", p, r)
		}
		if _, err := tarName(strings.TrimPrefix(p, "/")); err == nil {
			n, _ := tarName(strings.TrimPrefix(p, "/"))
			if strings.HasPrefix(n, "/") || n == ".." || strings.HasPrefix(n, "../") {
				t.Fatalf("tar name %q cleaned to %q", p, n)
			}
		}
	})
}
