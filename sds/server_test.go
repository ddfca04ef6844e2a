package sds

import (
	"bytes"
	"context"
	"crypto/x509"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/internal/testkit/testlog"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"
)

func sotwReq(names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{Node: node(nil), TypeUrl: resourcev3.SecretType, ResourceNames: names}
}

// ack answers resp as Envoy does once it applied it.
func ack(resp *discoveryv3.DiscoveryResponse, names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: names,
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
}

func rootsOf(t *testing.T, s *tlsv3.Secret) []*x509.Certificate {
	t.Helper()
	vc := s.GetValidationContext()
	require.NotNil(t, vc, "secret %q is not a validation context", s.GetName())
	require.Nil(t, vc.GetCustomValidatorConfig())
	return certsFromPEM(t, vc.GetTrustedCa().GetInlineBytes())
}

// spiffeConfig decodes ALL's SPIFFE validator configuration into trust
// domain name → roots.
func spiffeConfig(t *testing.T, s *tlsv3.Secret) map[string][]*x509.Certificate {
	t.Helper()
	cv := s.GetValidationContext().GetCustomValidatorConfig()
	require.NotNil(t, cv, "secret %q has no custom validator", s.GetName())
	assert.Equal(t, SPIFFEValidatorName, cv.GetName())
	assert.Nil(t, s.GetValidationContext().GetTrustedCa())
	cfg := &tlsv3.SPIFFECertValidatorConfig{}
	require.NoError(t, cv.GetTypedConfig().UnmarshalTo(cfg))
	out := make(map[string][]*x509.Certificate)
	var names []string
	for _, td := range cfg.GetTrustDomains() {
		require.NotContains(t, out, td.GetName(), "duplicate trust domain")
		names = append(names, td.GetName())
		out[td.GetName()] = certsFromPEM(t, td.GetTrustBundle().GetInlineBytes())
	}
	assert.IsIncreasing(t, names)
	return out
}

func keysOf[M ~map[string]V, V any](m M) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestStreamSecrets(t *testing.T) {
	e := newEnv(t)
	s := e.stream("token-a")
	names := []string{"default", "ROOTCA", "ALL", "spiffe://remote.test", "spiffe://unknown.test", "bogus", "default"}
	require.NoError(t, s.Send(sotwReq(names...)))
	r1 := recv(t, s)
	assert.Equal(t, "1", r1.GetNonce())
	assert.Equal(t, resourcev3.SecretType, r1.GetTypeUrl())
	assert.NotEmpty(t, r1.GetVersionInfo())
	sec := secretsOf(t, r1)
	assert.ElementsMatch(t, []string{"default", "ROOTCA", "ALL", "spiffe://remote.test"}, keysOf(sec), "only subscribed names that exist")

	kp := keyPair(t, sec["default"])
	require.Len(t, kp.Leaf.URIs, 1)
	assert.Equal(t, idA.String(), kp.Leaf.URIs[0].String())
	assert.Len(t, kp.Certificate, 1, "no roots in the chain")
	_, err := kp.Leaf.Verify(x509.VerifyOptions{Roots: pool(e.ca.cert), CurrentTime: e.clock.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.NoError(t, err)

	assert.Equal(t, []*x509.Certificate{e.ca.cert}, rootsOf(t, sec["ROOTCA"]))
	assert.Equal(t, []*x509.Certificate{e.remote.cert}, rootsOf(t, sec["spiffe://remote.test"]))
	assert.Equal(t, map[string][]*x509.Certificate{
		"local.test":  {e.ca.cert},
		"remote.test": {e.remote.cert},
	}, spiffeConfig(t, sec["ALL"]))

	// ACK, then a trust change is pushed.
	require.NoError(t, s.Send(ack(r1, names...)))
	e.waitHandled(2)
	other := newTestCA(t, otherTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), e.remote.bundle(), other.bundle()}))
	r2 := recv(t, s)
	assert.Equal(t, "2", r2.GetNonce())
	assert.NotEqual(t, r1.GetVersionInfo(), r2.GetVersionInfo())
	sec = secretsOf(t, r2)
	assert.Len(t, sec, 4)
	assert.Equal(t, []string{"local.test", "other.test", "remote.test"}, sortedKeys(spiffeConfig(t, sec["ALL"])))
	assert.Equal(t, kp.Certificate, keyPair(t, sec["default"]).Certificate, "the certificate is unchanged")

	// A NACK is counted and answered with nothing; a request with a stale
	// nonce is neither ACK nor NACK and gets no response either, but its
	// names are the subscription from now on.
	nack := ack(r2, names...)
	nack.VersionInfo = r1.GetVersionInfo()
	nack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "rejected"}
	require.NoError(t, s.Send(nack))
	stale := ack(r1, "default", "ROOTCA")
	stale.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "old"}
	require.NoError(t, s.Send(stale))
	e.waitHandled(2)
	// The next response follows the next change: nonce 3, with the change.
	localBundle := e.ca.bundle()
	localBundle.AddX509Authority(other.cert)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{localBundle, e.remote.bundle(), other.bundle()}))
	r3 := recv(t, s)
	assert.Equal(t, "3", r3.GetNonce(), "no resend after the NACK or the stale request")
	sec = secretsOf(t, r3)
	assert.ElementsMatch(t, []string{"default", "ROOTCA"}, keysOf(sec))
	assert.Equal(t, []*x509.Certificate{e.ca.cert, other.cert}, rootsOf(t, sec["ROOTCA"]))
	assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.nacks.WithLabelValues(typeSotW)))

	// Nothing changed: a new Trust with the same content sends nothing.
	require.NoError(t, s.Send(ack(r3, "default", "ROOTCA")))
	e.waitHandled(1)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{localBundle, e.remote.bundle(), other.bundle()}))
	// Resubscription: the new set, and only it.
	require.NoError(t, s.Send(ack(r3, "spiffe://other.test")))
	r4 := recv(t, s)
	assert.Equal(t, "4", r4.GetNonce())
	sec = secretsOf(t, r4)
	assert.Equal(t, []string{"spiffe://other.test"}, keysOf(sec))
	assert.Equal(t, []*x509.Certificate{other.cert}, rootsOf(t, sec["spiffe://other.test"]))

	// Unsubscribing from everything: an empty response.
	require.NoError(t, s.Send(ack(r4)))
	r5 := recv(t, s)
	assert.Equal(t, "5", r5.GetNonce())
	assert.Empty(t, r5.GetResources())
	require.NoError(t, s.CloseSend())
}

func sortedKeys[V any](m map[string]V) []string {
	out := keysOf(m)
	slicesSort(out)
	return out
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func TestStreamSecretsTrustDomainAppears(t *testing.T) {
	e := newEnv(t)
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("spiffe://other.test")))
	// Nothing exists yet, so nothing is sent; ROOTCA arrives when asked for.
	require.NoError(t, s.Send(sotwReq("spiffe://other.test", "ROOTCA")))
	r1 := recv(t, s)
	assert.Equal(t, []string{"ROOTCA"}, keysOf(secretsOf(t, r1)))
	require.NoError(t, s.Send(ack(r1, "spiffe://other.test", "ROOTCA")))
	e.waitHandled(3)

	other := newTestCA(t, otherTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), other.bundle()}))
	r2 := recv(t, s)
	sec := secretsOf(t, r2)
	assert.ElementsMatch(t, []string{"ROOTCA", "spiffe://other.test"}, keysOf(sec))
	assert.Equal(t, []*x509.Certificate{other.cert}, rootsOf(t, sec["spiffe://other.test"]))
}

func TestStreamSecretsRefused(t *testing.T) {
	noCredentials := func(c *Config) { c.Credentials = nil }
	emptyCell := func(c *Config) { c.Credentials = NewCredentialCell(idA) }
	failing := func(c *Config) {
		c.Credentials = CredentialSourceFunc(func(context.Context, spiffeid.ID) (*Credential, error) {
			return nil, errTest
		})
	}
	otherKey := func(c *Config) {
		// A buggy source handing out B's credential to A.
		m := c.Credentials
		c.Credentials = CredentialSourceFunc(func(ctx context.Context, _ spiffeid.ID) (*Credential, error) {
			return m.Credential(ctx, idB)
		})
	}
	tests := []struct {
		name     string
		opt      envOption
		token    string
		names    []string
		code     codes.Code
		msg      string
		authFail float64
	}{
		{"no credentials", nil, "", []string{"ROOTCA"}, codes.Unauthenticated, "no valid credentials", 1},
		{"unknown token", nil, "token-zzzzzz", []string{"ROOTCA"}, codes.Unauthenticated, "no valid credentials", 1},
		{"foreign trust domain", nil, "token-foreign", []string{"ROOTCA"}, codes.PermissionDenied, "not a member of trust domain local.test", 1},
		{"another workload's certificate", nil, "token-a", []string{"ROOTCA", idB.String()}, codes.PermissionDenied, "is not the certificate of the authenticated identity", 0},
		{"certificate of a federated ID", nil, "token-a", []string{"spiffe://remote.test/ns/a/sa/a"}, codes.PermissionDenied, "is not the certificate", 0},
		{"no credential source", noCredentials, "token-a", []string{"default"}, codes.PermissionDenied, "hands out no certificates", 0},
		{"no credential yet", emptyCell, "token-a", []string{"default"}, codes.Unavailable, "no certificate for this identity yet", 0},
		{"source fails", failing, "token-a", []string{"default"}, codes.Unavailable, "certificate not available", 0},
		{"source returns another identity's key", otherKey, "token-a", []string{"default"}, codes.Unavailable, "certificate not available", 0},
		{"too many names", nil, "token-a", make([]string, MaxNames+1), codes.InvalidArgument, "at most 64", 0},
		{"name too long", nil, "token-a", []string{strings.Repeat("x", MaxNameLen+1)}, codes.InvalidArgument, "2049 bytes long", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []envOption
			if tt.opt != nil {
				opts = append(opts, tt.opt)
			}
			e := newEnv(t, opts...)
			s := e.stream(tt.token)
			send(t, s, sotwReq(tt.names...))
			_, err := s.Recv()
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, tt.msg)
			assert.Equal(t, tt.authFail, testutil.ToFloat64(e.server.metrics.authFails))
			if tt.name == "another workload's certificate" {
				assert.Zero(t, e.ca.signCount(), "the source is never asked")
			}
		})
	}
	t.Run("authentication backend unavailable", func(t *testing.T) {
		e := newEnv(t)
		e.tokens.unavailable = true
		s := e.stream("token-a")
		send(t, s, sotwReq("ROOTCA"))
		_, err := s.Recv()
		assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	})
	t.Run("token valid, its claims not allowed", func(t *testing.T) {
		e := newEnv(t)
		e.tokens.denied = true
		s := e.stream("token-a")
		send(t, s, sotwReq("ROOTCA"))
		_, err := s.Recv()
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, "its claims do not grant an identity")
		assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.authFails))
	})
	t.Run("wrong type", func(t *testing.T) {
		e := newEnv(t)
		s := e.stream("token-a")
		req := sotwReq("ROOTCA")
		req.TypeUrl = resourcev3.ClusterType
		send(t, s, req)
		_, err := s.Recv()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	})
}

func TestStreamSecretsKeysStayWithTheirIdentity(t *testing.T) {
	e := newEnv(t)
	a, b := e.stream("token-a"), e.stream("token-b")
	require.NoError(t, a.Send(sotwReq("default", idA.String(), "ALL")))
	require.NoError(t, b.Send(sotwReq("default", idB.String())))
	ra, rb := recv(t, a), recv(t, b)
	secA, secB := secretsOf(t, ra), secretsOf(t, rb)
	keyA := secA["default"].GetTlsCertificate().GetPrivateKey().GetInlineBytes()
	keyB := secB["default"].GetTlsCertificate().GetPrivateKey().GetInlineBytes()
	require.NotEmpty(t, keyA)
	require.NotEmpty(t, keyB)
	assert.Equal(t, keyA, secA[idA.String()].GetTlsCertificate().GetPrivateKey().GetInlineBytes(), "the ID name is the same credential")
	assert.Equal(t, keyB, secB[idB.String()].GetTlsCertificate().GetPrivateKey().GetInlineBytes())
	for _, r := range ra.GetResources() {
		assert.False(t, bytes.Contains(r.GetValue(), keyB))
	}
	for _, r := range rb.GetResources() {
		assert.False(t, bytes.Contains(r.GetValue(), keyA))
	}
	assert.Equal(t, idB.String(), keyPair(t, secB["default"]).Leaf.URIs[0].String())
}

func TestStreamSecretsDisableSPIFFEValidation(t *testing.T) {
	tests := []struct {
		name  string
		meta  map[string]any
		plain bool
	}{
		{"bool true", map[string]any{DisableSPIFFEValidationKey: true}, true},
		{"string true", map[string]any{DisableSPIFFEValidationKey: "true"}, true},
		{"string True", map[string]any{DisableSPIFFEValidationKey: "True"}, true},
		{"string 1", map[string]any{DisableSPIFFEValidationKey: "1"}, true},
		{"string false", map[string]any{DisableSPIFFEValidationKey: "false"}, false},
		{"number 1", map[string]any{DisableSPIFFEValidationKey: 1}, false},
		{"bool false", map[string]any{DisableSPIFFEValidationKey: false}, false},
		{"string yes", map[string]any{DisableSPIFFEValidationKey: "yes"}, false},
		{"absent", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			// other.test shares local.test's root: it is sent once.
			other := newTestCA(t, otherTD, e.clock)
			shared := x509bundle.FromX509Authorities(otherTD, []*x509.Certificate{e.ca.cert, other.cert})
			require.NoError(t, e.trust.Set([]*x509bundle.Bundle{shared, e.remote.bundle(), e.ca.bundle()}))
			s := e.stream("token-a")
			req := sotwReq("ALL", "ROOTCA")
			req.Node = node(tt.meta)
			require.NoError(t, s.Send(req))
			sec := secretsOf(t, recv(t, s))
			assert.Equal(t, []*x509.Certificate{e.ca.cert}, rootsOf(t, sec["ROOTCA"]))
			if tt.plain {
				assert.Equal(t, []*x509.Certificate{e.ca.cert, other.cert, e.remote.cert}, rootsOf(t, sec["ALL"]))
				return
			}
			assert.Equal(t, map[string][]*x509.Certificate{
				"local.test":  {e.ca.cert},
				"other.test":  {e.ca.cert, other.cert},
				"remote.test": {e.remote.cert},
			}, spiffeConfig(t, sec["ALL"]))
		})
	}
}

func TestStreamSecretsAllNeverEmpty(t *testing.T) {
	e := newEnv(t)
	require.NoError(t, e.trust.Set(nil))
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("ALL", "default")))
	r1 := recv(t, s)
	assert.Equal(t, []string{"default"}, keysOf(secretsOf(t, r1)), "no ALL without trust domains")
	require.NoError(t, s.Send(ack(r1, "ALL", "default")))
	e.waitHandled(2)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.remote.bundle()}))
	sec := secretsOf(t, recv(t, s))
	assert.Equal(t, map[string][]*x509.Certificate{"remote.test": {e.remote.cert}}, spiffeConfig(t, sec["ALL"]))
}

// deltaNames maps a delta response's resources to their versions.
func deltaNames(t *testing.T, resp *discoveryv3.DeltaDiscoveryResponse) map[string]string {
	t.Helper()
	out := make(map[string]string)
	for _, r := range resp.GetResources() {
		s := &tlsv3.Secret{}
		require.NoError(t, r.GetResource().UnmarshalTo(s))
		require.Equal(t, r.GetName(), s.GetName())
		require.NotEmpty(t, r.GetVersion())
		out[r.GetName()] = r.GetVersion()
	}
	return out
}

func recvDelta(t *testing.T, s deltaClient) *discoveryv3.DeltaDiscoveryResponse {
	t.Helper()
	resp, err := s.Recv()
	require.NoError(t, err)
	return resp
}

func deltaAck(resp *discoveryv3.DeltaDiscoveryResponse) *discoveryv3.DeltaDiscoveryRequest {
	return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResponseNonce: resp.GetNonce()}
}

func TestDeltaSecrets(t *testing.T) {
	e := newEnv(t)
	names := []string{"default", "ROOTCA", "ALL", "spiffe://remote.test", "spiffe://other.test"}

	// A first stream learns the versions.
	first := e.delta("token-a")
	require.NoError(t, first.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(nil), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: names}))
	r0 := recvDelta(t, first)
	v0 := deltaNames(t, r0)
	assert.ElementsMatch(t, []string{"default", "ROOTCA", "ALL", "spiffe://remote.test"}, keysOf(v0))
	assert.Empty(t, r0.GetRemovedResources())

	// A reconnecting client that has some of them gets only the others.
	s := e.delta("token-a")
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{
		Node: node(nil), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: names,
		InitialResourceVersions: map[string]string{
			"ROOTCA":               v0["ROOTCA"],
			"spiffe://remote.test": v0["spiffe://remote.test"],
			"ALL":                  "outdated",
			"not-subscribed":       "1",
		},
	}))
	r1 := recvDelta(t, s)
	assert.Equal(t, map[string]string{"default": v0["default"], "ALL": v0["ALL"]}, deltaNames(t, r1))
	assert.Empty(t, r1.GetRemovedResources())
	assert.Equal(t, "1", r1.GetNonce())
	require.NoError(t, s.Send(deltaAck(r1)))
	e.waitHandled(3)

	// A new trust domain: ALL changed and spiffe://other.test appeared.
	other := newTestCA(t, otherTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), e.remote.bundle(), other.bundle()}))
	r2 := recvDelta(t, s)
	assert.ElementsMatch(t, []string{"ALL", "spiffe://other.test"}, keysOf(deltaNames(t, r2)), "only changes")
	assert.Empty(t, r2.GetRemovedResources())
	require.NoError(t, s.Send(deltaAck(r2)))
	e.waitHandled(1)

	// remote.test disappears.
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), other.bundle()}))
	r3 := recvDelta(t, s)
	assert.Equal(t, []string{"ALL"}, keysOf(deltaNames(t, r3)))
	assert.Equal(t, []string{"spiffe://remote.test"}, r3.GetRemovedResources())

	// NACK: no resend; the next change comes with the next nonce.
	nack := deltaAck(r3)
	nack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "rejected"}
	require.NoError(t, s.Send(nack))
	// Unsubscribing sends nothing either.
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesUnsubscribe: []string{"ALL"}}))
	e.waitHandled(2)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), e.remote.bundle(), other.bundle()}))
	r4 := recvDelta(t, s)
	assert.Equal(t, "4", r4.GetNonce())
	assert.Equal(t, []string{"spiffe://remote.test"}, keysOf(deltaNames(t, r4)), "unsubscribed ALL is not sent")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.nacks.WithLabelValues(typeDelta)))

	// Subscribing again sends the current version.
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{ResponseNonce: r4.GetNonce(), ResourceNamesSubscribe: []string{"ALL"}}))
	r5 := recvDelta(t, s)
	assert.Equal(t, []string{"ALL"}, keysOf(deltaNames(t, r5)))
	e.waitHandled(1)

	t.Run("trust domain appears", func(t *testing.T) {
		s := e.delta("token-b")
		send(t, s, &discoveryv3.DeltaDiscoveryRequest{Node: node(nil), ResourceNamesSubscribe: []string{"spiffe://later.test"}})
		e.waitHandled(1)
		later := newTestCA(t, spiffeid.RequireTrustDomainFromString("later.test"), e.clock)
		require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), later.bundle()}))
		r := recvDelta(t, s)
		assert.Equal(t, "1", r.GetNonce(), "nothing was sent before")
		assert.Equal(t, []string{"spiffe://later.test"}, keysOf(deltaNames(t, r)))
	})
	t.Run("limits", func(t *testing.T) {
		s := e.delta("token-a")
		send(t, s, &discoveryv3.DeltaDiscoveryRequest{Node: node(nil), ResourceNamesSubscribe: make([]string, MaxNames+1)})
		_, err := s.Recv()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	})
	t.Run("another workload", func(t *testing.T) {
		s := e.delta("token-a")
		send(t, s, &discoveryv3.DeltaDiscoveryRequest{Node: node(nil), ResourceNamesSubscribe: []string{idB.String()}})
		_, err := s.Recv()
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	})
	t.Run("unauthenticated", func(t *testing.T) {
		s := e.delta("")
		send(t, s, &discoveryv3.DeltaDiscoveryRequest{Node: node(nil), ResourceNamesSubscribe: []string{"ROOTCA"}})
		_, err := s.Recv()
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	})
}

func TestFetchSecrets(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := withToken(context.Background(), "token-a")
	resp, err := c.FetchSecrets(ctx, sotwReq("default", "ROOTCA", "spiffe://nowhere.test"))
	require.NoError(t, err)
	assert.NotEmpty(t, resp.GetVersionInfo())
	sec := secretsOf(t, resp)
	assert.ElementsMatch(t, []string{"default", "ROOTCA"}, keysOf(sec))
	assert.Equal(t, idA.String(), keyPair(t, sec["default"]).Leaf.URIs[0].String())

	again, err := c.FetchSecrets(ctx, sotwReq("default", "ROOTCA"))
	require.NoError(t, err)
	assert.Equal(t, resp.GetVersionInfo(), again.GetVersionInfo(), "same content, same version")

	_, err = c.FetchSecrets(context.Background(), sotwReq("ROOTCA"))
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = c.FetchSecrets(ctx, sotwReq(idB.String()))
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Equal(t, 2.0, testutil.ToFloat64(e.server.metrics.responses.WithLabelValues(typeFetch)))
}

func TestStreamSecretsRefresh(t *testing.T) {
	e := newEnv(t)
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("default")))
	r1 := recv(t, s)
	leaf1 := keyPair(t, secretsOf(t, r1)["default"]).Leaf
	require.NoError(t, s.Send(ack(r1, "default")))
	// The refresh timer is armed before the response is sent.
	require.True(t, e.clock.HasWaiters())

	e.clock.Step(30 * time.Minute)
	r2 := recv(t, s)
	leaf2 := keyPair(t, secretsOf(t, r2)["default"]).Leaf
	assert.NotEqual(t, leaf1.SerialNumber, leaf2.SerialNumber, "a new certificate")
	assert.Equal(t, e.clock.Now(), leaf2.NotBefore)
	require.NoError(t, s.Send(ack(r2, "default")))
	require.True(t, e.clock.HasWaiters())

	// The caller's token is revoked: the next refresh ends the stream.
	e.tokens.revoke("token-a")
	e.clock.Step(30 * time.Minute)
	_, err := s.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.authFails))
	assert.Equal(t, 2, e.ca.signCount(), "no certificate after the failed re-authentication")
}

func TestStreamSecretsCredentialChanged(t *testing.T) {
	cell := NewCredentialCell(idA)
	e := newEnv(t, func(c *Config) { c.Credentials = cell })
	issue := func() {
		m, err := NewMinter(MinterConfig{Signer: e.ca, TTL: time.Hour, Clock: e.clock})
		require.NoError(t, err)
		cred, err := m.Credential(context.Background(), idA)
		require.NoError(t, err)
		require.NoError(t, cell.Set(cred.Chain, cred.Key))
	}
	issue()
	s := e.delta("token-a")
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(nil), ResourceNamesSubscribe: []string{"default"}}))
	v1 := deltaNames(t, recvDelta(t, s))["default"]
	issue()
	v2 := deltaNames(t, recvDelta(t, s))["default"]
	assert.NotEqual(t, v1, v2)
}

// A client that never reads fills its flow-control window, and the
// server's Send to it blocks; another client's updates are not delayed.
func TestSlowClientDoesNotDelayOthers(t *testing.T) {
	e := newEnv(t)
	// A bundle big enough that two responses overflow gRPC's window.
	var roots []*x509.Certificate
	for range 300 {
		roots = append(roots, newTestCA(t, remoteTD, e.clock).cert)
	}
	set := func(n int) {
		require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), x509bundle.FromX509Authorities(remoteTD, roots[:n])}))
	}
	set(250)
	slow := e.stream("token-a")
	require.NoError(t, slow.Send(sotwReq("ALL")))
	fast := e.stream("token-b")
	require.NoError(t, fast.Send(sotwReq("ALL")))
	resp := recv(t, fast)
	const rounds = 6
	for i := range rounds {
		require.NoError(t, fast.Send(ack(resp, "ALL")))
		set(251 + i)
		resp = recv(t, fast)
		assert.Len(t, spiffeConfig(t, secretsOf(t, resp)["ALL"])["remote.test"], 251+i)
	}
	sent := e.server.metrics.responses.WithLabelValues(typeSotW)
	// The fast client's responses have all been sent, the slow one's not.
	require.Eventually(t, func() bool { return testutil.ToFloat64(sent) >= rounds+1 }, 5*time.Second, time.Millisecond)
	assert.Less(t, testutil.ToFloat64(sent), float64(2*(rounds+1)), "the slow stream's Send is blocked")
}

func TestEncodedOncePerVersion(t *testing.T) {
	e := newEnv(t)
	var streams []sotwClient
	for _, tok := range []string{"token-a", "token-a", "token-a", "token-b"} {
		s := e.stream(tok)
		require.NoError(t, s.Send(sotwReq("default", "ROOTCA", "ALL")))
		streams = append(streams, s)
	}
	var last []*discoveryv3.DiscoveryResponse
	for _, s := range streams {
		last = append(last, recv(t, s))
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(e.server.metrics.cert), "one per identity")
	assert.Equal(t, 2.0, testutil.ToFloat64(e.server.metrics.validation), "ROOTCA and ALL once")
	// The same bytes go to every stream of one identity.
	assert.Equal(t, last[0].GetResources(), last[1].GetResources())

	for i, s := range streams {
		require.NoError(t, s.Send(ack(last[i], "default", "ROOTCA", "ALL")))
	}
	other := newTestCA(t, otherTD, e.clock)
	require.NoError(t, e.trust.Set([]*x509bundle.Bundle{e.ca.bundle(), e.remote.bundle(), other.bundle()}))
	for _, s := range streams {
		recv(t, s)
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(e.server.metrics.cert), "certificates are not re-encoded")
	assert.Equal(t, 4.0, testutil.ToFloat64(e.server.metrics.validation), "ROOTCA and ALL once per trust")
}

func TestNew(t *testing.T) {
	trust := NewTrustCell()
	auth := &tokens{}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"ok", Config{TrustDomain: localTD, Trust: trust, Authenticator: auth}, ""},
		{"no trust domain", Config{Trust: trust, Authenticator: auth}, "no trust domain"},
		{"no trust", Config{TrustDomain: localTD, Authenticator: auth}, "no trust source"},
		{"no authenticator", Config{TrustDomain: localTD, Trust: trust}, "no authenticator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if tt.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tt.wantErr)
			}
		})
	}
}

// trustFunc adapts a function to TrustSource.
type trustFunc func() *Trust

func (f trustFunc) Trust() *Trust { return f() }

// A source that breaks its contract (Changed closed, no newer Trust) does
// not make streams spin.
func TestFaultyTrustSourceDoesNotSpin(t *testing.T) {
	clk := newEnv(t).clock
	ca := newTestCA(t, localTD, clk)
	dead := make(chan struct{})
	close(dead)
	stuck := &Trust{Bundles: []*x509bundle.Bundle{ca.bundle()}, Changed: dead}
	var mu sync.Mutex
	calls := 0
	e := newEnv(t, func(c *Config) {
		c.Trust = trustFunc(func() *Trust {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return stuck
		})
	})
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("ROOTCA")))
	r1 := recv(t, s)
	require.NoError(t, s.Send(ack(r1, "ROOTCA")))
	e.waitHandled(2)
	mu.Lock()
	defer mu.Unlock()
	assert.Less(t, calls, 10)
}

// A reconnecting client may quote a nonce of its previous stream; nothing
// was sent on this one, so the request is answered.
func TestStreamSecretsNonceFromPreviousStream(t *testing.T) {
	e := newEnv(t)
	s := e.stream("token-a")
	req := sotwReq("ROOTCA")
	req.ResponseNonce, req.VersionInfo = "17", "abc"
	require.NoError(t, s.Send(req))
	r := recv(t, s)
	assert.Equal(t, "1", r.GetNonce())
	assert.Equal(t, []string{"ROOTCA"}, keysOf(secretsOf(t, r)))
}

// Two streams of one identity whose certificates come out already due
// (the CA's signing chain about to expire) share one signing instead of
// re-minting in turn, each new credential waking the other stream.
func TestStreamSecretsDueCredentialsDoNotPingPong(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	signer, signs := dueSigner(t, newTestCA(t, localTD, clk))
	m, err := NewMinter(MinterConfig{Signer: signer, TTL: time.Hour, Clock: clk})
	require.NoError(t, err)
	e := newEnv(t, func(c *Config) { c.Credentials = m })
	var certs [][]byte
	for range 2 {
		s := e.stream("token-a")
		require.NoError(t, s.Send(sotwReq("default")))
		certs = append(certs, keyPair(t, secretsOf(t, recv(t, s))["default"]).Certificate[0])
	}
	assert.True(t, bytes.Equal(certs[0], certs[1]), "one credential for both streams")
	assert.Equal(t, 1, signs())
}

// A stream that asks for validation contexts only holds no certificate to
// refresh, yet must still end when its caller's credentials are revoked.
func TestValidationOnlyStreamsReauthenticate(t *testing.T) {
	for _, proto := range []string{"sotw", "delta"} {
		t.Run(proto, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.ReauthInterval = time.Minute })
			var recvErr func() error
			if proto == "sotw" {
				s := e.stream("token-a")
				require.NoError(t, s.Send(sotwReq("ROOTCA", "ALL")))
				r := recv(t, s)
				require.NoError(t, s.Send(ack(r, "ROOTCA", "ALL")))
				recvErr = func() error { _, err := s.Recv(); return err }
			} else {
				s := e.delta("token-a")
				require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(nil), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"ROOTCA"}}))
				recvDelta(t, s)
				recvErr = func() error { _, err := s.Recv(); return err }
			}
			<-e.handled
			require.True(t, e.clock.HasWaiters(), "a re-authentication is scheduled")

			// Still valid: the stream goes on, re-armed.
			e.clock.Step(time.Minute)
			require.Eventually(t, e.clock.HasWaiters, 10*time.Second, 10*time.Millisecond)

			e.tokens.revoke("token-a")
			e.clock.Step(time.Minute)
			assert.Equal(t, codes.Unauthenticated, status.Code(recvErr()))
			assert.Equal(t, 1.0, testutil.ToFloat64(e.server.metrics.authFails))
			assert.Zero(t, e.ca.signCount(), "no certificate was asked for")
		})
	}
}

// A push every Envoy rejects would log once per stream; warnings are
// bounded, every NACK is still counted.
func TestNACKWarningsAreBounded(t *testing.T) {
	logs := &testlog.Buffer{}
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	// No refill: the test does not depend on how fast it runs.
	e.server.nackLog = ratelimit.NewLogLimiter(0, 3)
	s := e.stream("token-a")
	require.NoError(t, s.Send(sotwReq("ROOTCA")))
	r := recv(t, s)
	const n = 40
	for range n {
		nack := ack(r, "ROOTCA")
		nack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "bad secret"}
		require.NoError(t, s.Send(nack))
	}
	var warns, debugs int
	require.Eventually(t, func() bool {
		warns = strings.Count(logs.String(), `"level":"WARN","msg":"envoy rejected secrets"`)
		debugs = strings.Count(logs.String(), `"level":"DEBUG","msg":"envoy rejected secrets"`)
		return warns+debugs == n
	}, 10*time.Second, 10*time.Millisecond, "every NACK is logged at some level")
	t.Logf("%d warnings, %d debug lines for %d NACKs", warns, debugs, n)
	assert.Equal(t, float64(n), testutil.ToFloat64(e.server.metrics.nacks.WithLabelValues(typeSotW)), "and counted")
	assert.Equal(t, 3, warns, "the first ones are warnings, the rest Debug")
}
