package sds

import (
	"context"
	"crypto"
	"crypto/x509"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

func newDNSMinter(t *testing.T, ca *testCA, clk *clocktesting.FakeClock, logs *testlog.Buffer, reg prometheus.Registerer) *Minter {
	t.Helper()
	tmpl, err := workloaddns.Parse("{sa}.{ns}.svc", localTD)
	require.NoError(t, err)
	cfg := MinterConfig{Signer: ca, TTL: time.Hour, Clock: clk, WorkloadDNSNames: tmpl, Registerer: reg}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	m, err := NewMinter(cfg)
	require.NoError(t, err)
	return m
}

func kubeIdentity(id spiffeid.ID, method string) authn.Identity {
	ns, sa, _ := authn.ServiceAccountOf(id)
	return authn.Identity{ID: id, Method: method, Grant: &authn.Grant{Method: authn.MethodKubernetesJWT, Ref: ns + "/" + sa}}
}

// TestMinterWorkloadDNSNames: the grant decides the name, and credentials
// with and without one are never shared between callers of one SPIFFE ID.
func TestMinterWorkloadDNSNames(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ca := newTestCA(t, localTD, clk)
	reg := prometheus.NewRegistry()
	m := newDNSMinter(t, ca, clk, nil, reg)

	kube, err := m.CredentialFor(ctx, kubeIdentity(idA, authn.MethodKubernetesJWT))
	require.NoError(t, err)
	assert.Equal(t, []string{"a.a.svc"}, kube.Chain[0].DNSNames)
	require.Len(t, kube.Chain[0].URIs, 1)
	assert.Equal(t, idA.String(), kube.Chain[0].URIs[0].String())

	// An Envoy presenting the SVID a Kubernetes token bought: same grant,
	// same credential.
	svid, err := m.CredentialFor(ctx, kubeIdentity(idA, authn.MethodX509SVID))
	require.NoError(t, err)
	assert.Same(t, kube, svid)

	boot, err := m.CredentialFor(ctx, authn.Identity{ID: idA, Method: authn.MethodBootstrapToken,
		Grant: &authn.Grant{Method: authn.MethodBootstrapToken, Ref: "ref"}})
	require.NoError(t, err)
	assert.Empty(t, boot.Chain[0].DNSNames, "a bootstrap token gives no DNS name")
	assert.NotSame(t, kube, boot)
	noGrant, err := m.CredentialFor(ctx, authn.Identity{ID: idA, Method: authn.MethodX509SVID})
	require.NoError(t, err)
	assert.Same(t, boot, noGrant)
	plain, err := m.Credential(ctx, idA)
	require.NoError(t, err)
	assert.Same(t, boot, plain)

	assert.Equal(t, 2, ca.signCount())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.dnsNames.WithLabelValues("added")))
	n, err := testutil.GatherAndCount(reg, "trustbridge_sds_workload_dns_names_total")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// TestMinterWorkloadDNSNamesSkipped: a service account name with a dot
// gets its certificate without a name, logged and counted once per
// certificate minted.
func TestMinterWorkloadDNSNamesSkipped(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ca := newTestCA(t, localTD, clk)
	logs := &testlog.Buffer{}
	m := newDNSMinter(t, ca, clk, logs, nil)
	dotted := spiffeid.RequireFromPath(localTD, "/ns/a/sa/web.v2")
	for range 2 {
		cred, err := m.CredentialFor(ctx, kubeIdentity(dotted, authn.MethodKubernetesJWT))
		require.NoError(t, err)
		assert.Empty(t, cred.Chain[0].DNSNames)
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(m.dnsNames.WithLabelValues("skipped")))
	assert.Contains(t, logs.String(), "SDS certificate minted without a workload DNS name")
	assert.Contains(t, logs.String(), "holds '.'")
}

func TestMinterWorkloadDNSNamesNeedADNSSigner(t *testing.T) {
	tmpl, err := workloaddns.Parse("{sa}.{ns}.svc", localTD)
	require.NoError(t, err)
	_, err = NewMinter(MinterConfig{TTL: time.Hour, WorkloadDNSNames: tmpl,
		Signer: SignerFunc(func(crypto.PublicKey, spiffeid.ID, time.Duration) ([]*x509.Certificate, error) {
			return nil, errTest
		})})
	assert.ErrorContains(t, err, "no DNSSigner")
}

// TestStreamSecretsWorkloadDNSName: the server hands the minter the
// identity it authenticated, grant included.
func TestStreamSecretsWorkloadDNSName(t *testing.T) {
	e := newEnv(t, func(cfg *Config) {
		tokens := cfg.Authenticator
		cfg.Authenticator = authn.AuthenticatorFunc(func(ctx context.Context, r authn.Request) (authn.Identity, error) {
			ident, err := tokens.Authenticate(ctx, r)
			if err != nil || r.BearerToken != "token-a" {
				return ident, err
			}
			return kubeIdentity(ident.ID, authn.MethodKubernetesJWT), nil
		})
		ca := cfg.Credentials.(*Minter).cfg.Signer.(*testCA)
		cfg.Credentials = newDNSMinter(t, ca, cfg.Clock.(*clocktesting.FakeClock), nil, nil)
	})
	for tok, want := range map[string][]string{"token-a": {"a.a.svc"}, "token-b": nil} {
		s := e.stream(tok)
		require.NoError(t, s.Send(sotwReq("default")))
		leaf := keyPair(t, secretsOf(t, recv(t, s))["default"]).Leaf
		assert.Equal(t, want, leaf.DNSNames, tok)
	}
}
