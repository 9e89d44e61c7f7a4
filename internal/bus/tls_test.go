package bus

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// writeTestPKI writes a CA and a certificate for 127.0.0.1 signed by it.
func writeTestPKI(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "warren test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// TestTLSBetweenServersAndClients: with a certificate, two routed servers
// and their clients speak TLS (and authenticate): a plain-text client is
// refused, a message crosses the route.
func TestTLSBetweenServersAndClients(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeTestPKI(t, dir)
	auth, err := EnsureAuth(filepath.Join(dir, "auth"), []string{"n1"})
	if err != nil {
		t.Fatal(err)
	}
	client := []string{freeAddr(t), freeAddr(t)}
	routes := []string{"nats-route://" + freeAddr(t), "nats-route://" + freeAddr(t)}
	var srvs [2]*Embedded
	errs := make(chan error, 2)
	for i := range srvs {
		go func(i int) {
			var err error
			srvs[i], err = StartEmbedded(EmbeddedConfig{DataDir: filepath.Join(dir, "s", string(rune('a'+i))), Listen: client[i],
				ServerName: "s" + string(rune('a'+i)), ClusterListen: routes[i][len("nats-route://"):], Routes: routes,
				Auth: auth, TLSCert: cert, TLSKey: key, TLSCA: ca})
			errs <- err
		}(i)
	}
	for range srvs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer srvs[0].Shutdown()
	defer srvs[1].Shutdown()

	if nc, err := nats.Connect("nats://"+client[0], nats.Timeout(3*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a client without TLS (and credentials) connected")
	}
	api, err := Dial(DialConfig{URLs: "tls://" + client[0], NKeySeed: auth.Path(RoleAPIServer, ""), TLSCA: ca, Role: RoleAPIServer})
	if err != nil {
		t.Fatalf("apiserver over TLS: %v", err)
	}
	defer api.Close()
	edge, err := Dial(DialConfig{URLs: "tls://" + client[1], NKeySeed: auth.Path(RoleEdge, "n1"), TLSCA: ca, Role: RoleEdge, Node: "n1"})
	if err != nil {
		t.Fatalf("edge over TLS: %v", err)
	}
	defer edge.Close()
	got := make(chan struct{}, 1)
	if _, err := api.Subscribe(SubjectHeartbeat, func([]byte) {
		select {
		case got <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	_ = api.NATS().Flush()
	deadline := time.After(30 * time.Second)
	for {
		_ = edge.Publish(SubjectHeartbeat, "n1")
		select {
		case <-got:
			return // the heartbeat crossed the TLS route
		case <-deadline:
			t.Fatal("no heartbeat crossed the route")
		case <-time.After(200 * time.Millisecond):
		}
	}
}
