package agent

import (
	"strconv"
	"strings"
)

// parseExports parses the output of `export -p` as dash, busybox ash, bash
// (`declare -x`, also in POSIX mode) and zsh print it. Names exported without
// a value are skipped. Malformed input never panics; what can be parsed is
// returned.
func parseExports(s string) map[string]string {
	env := make(map[string]string)
	p := &wordParser{s: s}
	for {
		words, ok := p.line()
		if !ok {
			return env
		}
		if len(words) == 0 {
			continue
		}
		switch words[0] {
		case "export", "declare", "typeset":
		default:
			continue
		}
		for _, w := range words[1:] {
			if strings.HasPrefix(w, "-") {
				continue // options such as -x, -rx
			}
			name, val, has := strings.Cut(w, "=")
			if !has || !validName(name) {
				continue
			}
			env[name] = val
		}
	}
}

// validName reports whether s is a shell variable name.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// shellQuote quotes s as one single-quoted shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

// wordParser splits shell text into words, handling '...', "...", $'...'
// and backslash escapes; unquoted newlines end a line.
type wordParser struct {
	s string
	i int
}

// line returns the words of the next logical line; ok is false at the end.
func (p *wordParser) line() (words []string, ok bool) {
	if p.i >= len(p.s) {
		return nil, false
	}
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\n':
			p.i++
			flush()
			return words, true
		case c == ' ' || c == '\t':
			p.i++
			flush()
		case c == '\'':
			inWord = true
			p.i++
			end := strings.IndexByte(p.s[p.i:], '\'')
			if end < 0 {
				cur.WriteString(p.s[p.i:])
				p.i = len(p.s)
			} else {
				cur.WriteString(p.s[p.i : p.i+end])
				p.i += end + 1
			}
		case c == '"':
			inWord = true
			p.i++
			p.double(&cur)
		case c == '$' && p.i+1 < len(p.s) && p.s[p.i+1] == '\'':
			inWord = true
			p.i += 2
			p.ansiC(&cur)
		case c == '\\':
			inWord = true
			p.i++
			if p.i < len(p.s) {
				if p.s[p.i] != '\n' { // backslash-newline is a continuation
					cur.WriteByte(p.s[p.i])
				}
				p.i++
			}
		default:
			inWord = true
			cur.WriteByte(c)
			p.i++
		}
	}
	flush()
	return words, true
}

// double reads a double-quoted string body (after the opening quote).
func (p *wordParser) double(cur *strings.Builder) {
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch c {
		case '"':
			p.i++
			return
		case '\\':
			if p.i+1 < len(p.s) {
				n := p.s[p.i+1]
				switch n {
				case '$', '`', '"', '\\':
					cur.WriteByte(n)
					p.i += 2
					continue
				case '\n':
					p.i += 2
					continue
				}
			}
			cur.WriteByte(c)
			p.i++
		default:
			cur.WriteByte(c)
			p.i++
		}
	}
}

// ansiC reads a $'...' body (after the opening quote).
func (p *wordParser) ansiC(cur *strings.Builder) {
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '\'' {
			p.i++
			return
		}
		if c != '\\' || p.i+1 >= len(p.s) {
			cur.WriteByte(c)
			p.i++
			continue
		}
		n := p.s[p.i+1]
		p.i += 2
		switch n {
		case 'a':
			cur.WriteByte('\a')
		case 'b':
			cur.WriteByte('\b')
		case 'e', 'E':
			cur.WriteByte(0x1b)
		case 'f':
			cur.WriteByte('\f')
		case 'n':
			cur.WriteByte('\n')
		case 'r':
			cur.WriteByte('\r')
		case 't':
			cur.WriteByte('\t')
		case 'v':
			cur.WriteByte('\v')
		case '\\', '\'', '"', '?':
			cur.WriteByte(n)
		case 'x':
			p.numeric(cur, 16, 2)
		case 'u':
			p.unicode(cur, 4)
		case 'U':
			p.unicode(cur, 8)
		case 'c':
			if p.i < len(p.s) {
				cur.WriteByte(p.s[p.i] & 0x1f)
				p.i++
			}
		default:
			if n >= '0' && n <= '7' {
				p.i--
				p.numeric(cur, 8, 3)
			} else {
				cur.WriteByte('\\')
				cur.WriteByte(n)
			}
		}
	}
}

func (p *wordParser) digits(base, max int) (uint64, bool) {
	j := p.i
	for j < len(p.s) && j-p.i < max && isDigit(p.s[j], base) {
		j++
	}
	if j == p.i {
		return 0, false
	}
	v, err := strconv.ParseUint(p.s[p.i:j], base, 32)
	p.i = j
	return v, err == nil
}

func (p *wordParser) numeric(cur *strings.Builder, base, max int) {
	if v, ok := p.digits(base, max); ok {
		cur.WriteByte(byte(v))
	}
}

func (p *wordParser) unicode(cur *strings.Builder, max int) {
	if v, ok := p.digits(16, max); ok {
		cur.WriteRune(rune(v))
	}
}

func isDigit(c byte, base int) bool {
	switch {
	case c >= '0' && c <= '7':
		return true
	case c == '8' || c == '9':
		return base >= 10
	case c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		return base == 16
	}
	return false
}
