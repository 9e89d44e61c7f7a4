package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// parseKV turns repeated K=V flags into a map.
func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, v)
		}
		m[k] = val
	}
	return m, nil
}

// parseSeconds accepts a Go duration ("90s", "1h30m") or a plain number of
// seconds ("3600", "1.5") and returns seconds.
func parseSeconds(flag, s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 {
			return 0, fmt.Errorf("--%s %q: negative", flag, s)
		}
		return f, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("--%s %q: want seconds or a duration like 90s or 1h", flag, s)
	}
	if d < 0 {
		return 0, fmt.Errorf("--%s %q: negative", flag, s)
	}
	return d.Seconds(), nil
}

// parseSizeMB accepts a number of MiB ("512") or a size with a unit
// ("512m", "4g", "4GiB", "1t") and returns MiB.
func parseSizeMB(flag, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "b"), "i")
	mult := 1.0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult, t = 1.0/1024, t[:n-1]
		case 'm':
			mult, t = 1, t[:n-1]
		case 'g':
			mult, t = 1024, t[:n-1]
		case 't':
			mult, t = 1024*1024, t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("--%s %q: want MiB or a size like 512m or 4g", flag, s)
	}
	mb := int64(f*mult + 0.5)
	if mb == 0 && f > 0 {
		mb = 1
	}
	return mb, nil
}
