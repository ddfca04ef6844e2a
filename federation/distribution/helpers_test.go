package distribution

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// TestMain fails the tests if a goroutine outlives them (the controller's Run loop, its informers and pacer), once the
// shared API server is stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(kubetest.Tests(m)) }

const (
	localTD = "local.example"
	waitFor = 20 * time.Second
	tick    = 20 * time.Millisecond
)

// newStore returns a store holding a fresh CA for localTD under source
// "ca" and one for each federated trust domain under "federation", and the
// CAs by trust domain name.
func newStore(t testing.TB, federated ...string) (*trust.Store, map[string]*testca.CA) {
	t.Helper()
	store := trust.NewStore()
	cas := map[string]*testca.CA{}
	for i, td := range append([]string{localTD}, federated...) {
		ca := testca.New(t, td)
		cas[td] = ca
		source := "federation"
		if i == 0 {
			source = "ca"
		}
		store.Set(source, ca.Bundle())
	}
	return store, cas
}

// bundleOf returns a bundle of td holding the given CA certificates.
func bundleOf(td string, certs ...*x509.Certificate) *spiffebundle.Bundle {
	b := spiffebundle.New(spiffeid.RequireTrustDomainFromString(td))
	for _, c := range certs {
		b.AddX509Authority(c)
	}
	return b
}

// parsePEM decodes every certificate of a PEM value.
func parsePEM(t require.TestingT, s string) []*x509.Certificate {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	var certs []*x509.Certificate
	rest := []byte(s)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		require.Equal(t, "CERTIFICATE", block.Type)
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		certs = append(certs, c)
	}
	require.Empty(t, rest, "trailing bytes after the PEM blocks")
	return certs
}

// startController runs c until the returned stop is called (or the test
// ends) and checks that Run returned nil.
func startController(t testing.TB, c interface{ Run(context.Context) error }) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Fatal("Run did not return after its context was cancelled")
		}
	}
	t.Cleanup(stop)
	return stop
}

// metricValue returns the value of the gathered metric name whose labels
// include want, or -1 when there is none. t may be an EventuallyWithT's
// *assert.CollectT.
func metricValue(t require.TestingT, g prometheus.Gatherer, name string, want map[string]string) float64 {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, want) {
				switch {
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// randomName returns prefix followed by 8 random hex digits.
func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func subjects(certs []*x509.Certificate) []string {
	out := make([]string, 0, len(certs))
	for _, c := range certs {
		out = append(out, c.Subject.String())
	}
	return out
}

// newPeerBundle returns the bundle of a fresh CA for peer.example.
func newPeerBundle(t testing.TB) *spiffebundle.Bundle {
	t.Helper()
	return testca.New(t, "peer.example").Bundle()
}
