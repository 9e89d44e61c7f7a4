package e2b

import (
	"testing"
)

func TestTokenFromKey(t *testing.T) {
	tok := "wrn_abcdefghijklmnopqrstuvwxyz234567"
	for _, c := range []struct {
		key, want string
		ok        bool
	}{
		{E2BKey(tok), tok, true},
		{tok, tok, true},
		{" " + tok + " ", tok, true},
		{"", "", false},
		{"e2b_", "", false},
		{"e2b_zz", "", false},
		{"e2b_abc", "", false}, // odd length
	} {
		got, err := TokenFromKey(c.key)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("TokenFromKey(%q) = %q, %v; want %q ok=%v", c.key, got, err, c.want, c.ok)
		}
	}
	if k := E2BKey(tok); k[:4] != "e2b_" {
		t.Fatalf("E2BKey = %q", k)
	}
}

func TestPageKey(t *testing.T) {
	k := pageKey{at: 1764600000123456789, id: "e2e-0000abc"}
	got, err := parsePageKey(k.String())
	if err != nil || got != k {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range []string{"", "!!", "eHh4", "MTIz", "YWJjL3g"} {
		if _, err := parsePageKey(bad); err == nil {
			t.Errorf("parsePageKey(%q) accepted", bad)
		}
	}
	if cmpKey(pageKey{1, "b"}, pageKey{1, "a"}) <= 0 || cmpKey(pageKey{1, "z"}, pageKey{2, "a"}) >= 0 {
		t.Fatal("order is start time, then id")
	}
}

// TestSignature checks the signed-URL signature against the vector
// e2b.md §4.6 records from the SDK.
func TestSignature(t *testing.T) {
	if got, want := signature("/home/user/x.txt", "read", "", "tok123", ""), "v1_Rb7zm5r+4GlfZDdRF1hHG2SpHuolxyovo25Fgc1ZJ0Y"; got != want {
		t.Fatalf("signature %q, want %q", got, want)
	}
	if signature("/a", "read", "", "k", "100") == signature("/a", "read", "", "k", "") {
		t.Fatal("the expiration is not signed")
	}
}

// TestPortHost reads the hosts getHost builds, and only those.
func TestPortHost(t *testing.T) {
	for _, c := range []struct {
		host string
		port int
		id   string
		ok   bool
	}{
		{"8000-e2e-0000abc.warren.example", 8000, "e2e-0000abc", true},
		{"49983-sb1.localhost:3000", 49983, "sb1", true},
		{"127.0.0.1:3000", 0, "", false},
		{"localhost:3000", 0, "", false},
		{"8000-sb1", 0, "", false},    // no domain
		{"0-sb1.d", 0, "", false},     // port 0
		{"65536-sb1.d", 0, "", false}, // too big
		{"080-sb1.d", 0, "", false},   // not canonical
		{"8000-.d", 0, "", false},     // no id
		{"api.warren.example", 0, "", false},
	} {
		port, id, ok := portHost(c.host)
		if ok != c.ok || port != c.port || id != c.id {
			t.Errorf("portHost(%q) = %d %q %v; want %d %q %v", c.host, port, id, ok, c.port, c.id, c.ok)
		}
	}
}

// TestAccessTokens checks that a sandbox's access token opens that
// sandbox only, for its kind only, and only while its key is remembered;
// a key passes as itself.
func TestAccessTokens(t *testing.T) {
	kt, other := newKeyTable(), newKeyTable()
	kt.remember("sb-a", "e2b_6b6579")
	kt.remember("sb-b", "e2b_6b6579")
	ta := kt.token(envdTokenPrefix, "sb-a")
	if ta == kt.token(envdTokenPrefix, "sb-b") || ta == kt.token(trafficTokenPrefix, "sb-a") || ta == other.token(envdTokenPrefix, "sb-a") {
		t.Fatal("tokens of two sandboxes, two kinds or two fronts are equal")
	}
	if k, err := kt.keyFor(envdTokenPrefix, "sb-a", " "+ta+" "); err != nil || k != "e2b_6b6579" {
		t.Fatalf("own token: %q %v", k, err)
	}
	for _, c := range []struct{ prefix, id, v string }{
		{envdTokenPrefix, "sb-b", ta},                                         // another sandbox
		{trafficTokenPrefix, "sb-a", ta},                                      // another kind
		{envdTokenPrefix, "sb-a", other.token(envdTokenPrefix, "sb-a")},       // another front
		{envdTokenPrefix, "sb-a", ta[:len(ta)-1]},                             // cut
		{envdTokenPrefix, "sb-c", kt.token(envdTokenPrefix, "sb-c")},          // key not remembered
		{trafficTokenPrefix, "sb-a", kt.token(envdTokenPrefix, "sb-a") + "x"}, // garbage
	} {
		if k, err := kt.keyFor(c.prefix, c.id, c.v); err == nil {
			t.Errorf("keyFor(%s, %s, %q) = %q, want refused", c.prefix, c.id, c.v, k)
		}
	}
	if k, err := kt.keyFor(envdTokenPrefix, "sb-z", "e2b_abcd"); err != nil || k != "e2b_abcd" {
		t.Fatalf("a key passes as itself: %q %v", k, err)
	}
	kt.forget("sb-a")
	if _, err := kt.keyFor(envdTokenPrefix, "sb-a", ta); err == nil {
		t.Fatal("a forgotten sandbox's token still opens it")
	}
}
