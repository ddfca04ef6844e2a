package agent

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

func bundleOf(ca *testca.CA) *x509bundle.Bundle {
	return x509bundle.FromX509Authorities(ca.TrustDomain, []*x509.Certificate{ca.Cert})
}

func TestRunCA(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "socket")
	caA, caB, caC := testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	trust := sds.NewTrustCell()
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caB)}))
	up := newUpstream(t, caA, trust, "")
	rot := newFakeRotator(t, caA, workload)
	reg := prometheus.NewRegistry()
	a := caAgent(t, sock, rot, up.addr, reg)
	stop, done := runAgent(t, a)
	waitSocket(t, sock, done)

	names := []string{sds.DefaultName, sds.RootCAName, sds.AllName}
	s := mustStream(t, sock, names...)
	tds := func(want ...string) func(map[string]*tlsv3.Secret) bool {
		return func(m map[string]*tlsv3.Secret) bool {
			return hasAll(names...)(m) && assert.ObjectsAreEqual(want, trustDomainsOf(t, m[sds.AllName]))
		}
	}
	got := collect(t, s, tds("a.test", "b.test"), names...)
	assert.Equal(t, rot.svid.Certificates[0].Raw, leafOf(t, got[sds.DefaultName]).Raw)
	rot.mu.Lock()
	assert.Equal(t, []*x509.Certificate{caA.Cert}, rot.serverRoots)
	rot.mu.Unlock()

	// A federation change on the server reaches the socket at once.
	require.NoError(t, trust.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caB), bundleOf(caC)}))
	collect(t, s, tds("a.test", "b.test", "c.test"), names...)

	// The server goes away: the last good trust stays.
	up.gs.Stop()
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.metrics.relayStreamErrs) >= 1 }, 5*time.Second, 5*time.Millisecond)
	resp, err := socketClient(t, sock).FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.SecretType, ResourceNames: []string{sds.AllName},
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"a.test", "b.test", "c.test"}, trustDomainsOf(t, secretsOf(t, resp)[sds.AllName]))

	// It comes back on the same address with other trust: the relay
	// reconnects and relays it.
	trust2 := sds.NewTrustCell()
	require.NoError(t, trust2.Set([]*x509bundle.Bundle{bundleOf(caA), bundleOf(caC)}))
	newUpstream(t, caA, trust2, up.addr)
	collect(t, s, tds("a.test", "c.test"), names...)

	require.NoError(t, stop())
}

// scriptedSDS answers each request of a stream with the next scripted
// response, and reports every request.
type scriptedSDS struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	responses chan *discoveryv3.DiscoveryResponse
	requests  chan *discoveryv3.DiscoveryRequest
	kill      chan struct{}
}

func (s *scriptedSDS) StreamSecrets(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		s.requests <- req
		select {
		case resp := <-s.responses:
			if err := st.Send(resp); err != nil {
				return err
			}
		case <-s.kill:
			return status.Error(codes.Unavailable, "going away")
		case <-st.Context().Done():
			return nil
		}
	}
}

func allAny(t testing.TB, entries ...*tlsv3.SPIFFECertValidatorConfig_TrustDomain) *anypb.Any {
	t.Helper()
	cfg, err := anypb.New(&tlsv3.SPIFFECertValidatorConfig{TrustDomains: entries})
	require.NoError(t, err)
	return secretAny(t, &tlsv3.Secret{Name: sds.AllName, Type: &tlsv3.Secret_ValidationContext{
		ValidationContext: &tlsv3.CertificateValidationContext{CustomValidatorConfig: &corev3.TypedExtensionConfig{
			Name: sds.SPIFFEValidatorName, TypedConfig: cfg,
		}},
	}})
}

func rootCAAny(t testing.TB, pemBytes []byte) *anypb.Any {
	t.Helper()
	return secretAny(t, &tlsv3.Secret{Name: sds.RootCAName, Type: &tlsv3.Secret_ValidationContext{
		ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inlineBytes(pemBytes)},
	}})
}

func secretAny(t testing.TB, s *tlsv3.Secret) *anypb.Any {
	t.Helper()
	b, err := proto.Marshal(s)
	require.NoError(t, err)
	return &anypb.Any{TypeUrl: resourcev3.SecretType, Value: b}
}

func inlineBytes(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

func tdEntry(name string, pemBytes []byte) *tlsv3.SPIFFECertValidatorConfig_TrustDomain {
	return &tlsv3.SPIFFECertValidatorConfig_TrustDomain{Name: name, TrustBundle: inlineBytes(pemBytes)}
}

func trustNames(tr *sds.Trust) []string {
	var out []string
	for _, b := range tr.Bundles {
		out = append(out, b.TrustDomain().Name())
	}
	return out
}

func TestRelayNACKKeepsLastGood(t *testing.T) {
	caA, caB, caC := testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdC.Name())
	script := &scriptedSDS{
		responses: make(chan *discoveryv3.DiscoveryResponse),
		requests:  make(chan *discoveryv3.DiscoveryRequest, 16),
		kill:      make(chan struct{}),
	}
	up := &upstream{}
	leaf, key := caA.Issue(t, serverID)
	up.tls = upstreamTLS(leaf, key)
	up.gs = grpc.NewServer(grpc.Creds(credentials.NewTLS(up.tls)))
	secretv3.RegisterSecretDiscoveryServiceServer(up.gs, script)
	up.start(t, "")

	rot := newFakeRotator(t, caA, workload)
	trust := sds.NewTrustCell()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	require.NoError(t, err)
	r := &relay{
		addr: up.addr, tlsConfig: rot.ClientTLS, trust: trust, serverRoots: rot.SetServerRoots,
		local: tdA, nodeID: workload.String(), id: workload, policy: trustpolicy.NewCell(nil),
		seed:  map[spiffeid.TrustDomain][]*x509.Certificate{tdA: {caA.Cert}},
		clock: clock.RealClock{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: m,
		retry: loop.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond, Jitter: retryJitter},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	next := func() *discoveryv3.DiscoveryRequest {
		t.Helper()
		select {
		case req := <-script.requests:
			return req
		case <-time.After(5 * time.Second):
			t.Fatal("no request from the relay")
			return nil
		}
	}
	send := func(version, nonce string, res ...*anypb.Any) {
		script.responses <- &discoveryv3.DiscoveryResponse{VersionInfo: version, Nonce: nonce, TypeUrl: resourcev3.SecretType, Resources: res}
	}

	first := next()
	assert.ElementsMatch(t, []string{sds.AllName, sds.RootCAName}, first.GetResourceNames())
	assert.Equal(t, resourcev3.SecretType, first.GetTypeUrl())
	assert.Equal(t, workload.String(), first.GetNode().GetId())

	send("v1", "n1", allAny(t, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("b.test", pemCerts(caB.Cert))), rootCAAny(t, pemCerts(caA.Cert)))
	req := next()
	assert.Nil(t, req.GetErrorDetail())
	assert.Equal(t, "v1", req.GetVersionInfo())
	assert.Equal(t, "n1", req.GetResponseNonce())
	good := trust.Trust()
	assert.Equal(t, []string{"a.test", "b.test"}, trustNames(good))

	bad := []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"duplicate trust domain", []*anypb.Any{allAny(t, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("a.test", pemCerts(caB.Cert)))}, "listed twice"},
		{"not a certificate", []*anypb.Any{allAny(t, tdEntry("a.test", []byte("nope")))}, "not PEM"},
		{"one bad resource of two", []*anypb.Any{allAny(t, tdEntry("c.test", pemCerts(caC.Cert))), rootCAAny(t, nil)}, "ROOTCA"},
	}
	for i, b := range bad {
		nonce := "bad" + string(rune('0'+i))
		send("x", nonce, b.res...)
		req := next()
		require.NotNil(t, req.GetErrorDetail(), b.name)
		assert.Equal(t, int32(codes.InvalidArgument), req.GetErrorDetail().GetCode())
		assert.Contains(t, req.GetErrorDetail().GetMessage(), b.want, b.name)
		assert.Equal(t, "v1", req.GetVersionInfo(), "a NACK names the last accepted version")
		assert.Equal(t, nonce, req.GetResponseNonce())
		assert.Same(t, good, trust.Trust(), "%s: the last good trust stays", b.name)
	}
	assert.Equal(t, float64(len(bad)), testutil.ToFloat64(m.relayResponses.WithLabelValues(resultFailure)))

	// The stream breaks: the trust stays, the relay reconnects and asks
	// afresh.
	script.kill <- struct{}{}
	again := next()
	assert.Empty(t, again.GetResponseNonce())
	assert.Same(t, good, trust.Trust())
	send("v2", "n2", allAny(t, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("c.test", pemCerts(caC.Cert))))
	req = next()
	assert.Nil(t, req.GetErrorDetail())
	assert.Equal(t, []string{"a.test", "b.test", "c.test"}, trustNames(trust.Trust()), "b.test stays, to be denied")
	pol, _ := r.policy.Load()
	require.NotNil(t, pol)
	for td, want := range map[spiffeid.TrustDomain]bool{tdA: true, tdB: false, tdC: true} {
		_, ok := pol.Decide(trustpolicy.Subject{ID: workload}).Allows(td)
		assert.Equal(t, want, ok, td.Name())
	}
	assert.GreaterOrEqual(t, testutil.ToFloat64(m.relayStreamErrs), 1.0)
}

func TestParseValidation(t *testing.T) {
	caA, caB := testca.New(t, tdA.Name()), testca.New(t, tdB.Name())
	leaf, _ := caA.Issue(t, workload)
	typed := func(name string, cfg proto.Message) *anypb.Any {
		a, err := anypb.New(cfg)
		require.NoError(t, err)
		return secretAny(t, &tlsv3.Secret{Name: sds.AllName, Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: name, TypedConfig: a}},
		}})
	}
	tests := []struct {
		name    string
		in      *anypb.Any
		wantTDs []string
		wantErr string
	}{
		{"all", allAny(t, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("b.test", pemCerts(caB.Cert))), []string{"a.test", "b.test"}, ""},
		{"inline string", allAny(t, &tlsv3.SPIFFECertValidatorConfig_TrustDomain{Name: "a.test", TrustBundle: &corev3.DataSource{
			Specifier: &corev3.DataSource_InlineString{InlineString: string(pemCerts(caA.Cert))}}}), []string{"a.test"}, ""},
		{"rootca", rootCAAny(t, pemCerts(caA.Cert)), nil, ""},
		{"duplicate", allAny(t, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("a.test", pemCerts(caA.Cert))), nil, "listed twice"},
		{"spiffe prefix", allAny(t, tdEntry("spiffe://a.test", pemCerts(caA.Cert))), nil, "bare name"},
		{"bad name", allAny(t, tdEntry("A.TEST", pemCerts(caA.Cert))), nil, "trust domain 0"},
		{"empty name", allAny(t, tdEntry("", pemCerts(caA.Cert))), nil, "trust domain 0"},
		{"no trust domains", allAny(t), nil, "no trust_domains"},
		{"leaf as root", allAny(t, tdEntry("a.test", pemCerts(leaf))), nil, "not a CA"},
		{"trailing garbage", allAny(t, tdEntry("a.test", append(pemCerts(caA.Cert), "x"...))), nil, "not PEM"},
		{"file source", allAny(t, &tlsv3.SPIFFECertValidatorConfig_TrustDomain{Name: "a.test", TrustBundle: &corev3.DataSource{
			Specifier: &corev3.DataSource_Filename{Filename: "/etc/passwd"}}}), nil, "not inline"},
		{"too large", allAny(t, tdEntry("a.test", make([]byte, maxBundlePEM+1))), nil, "at most"},
		{"trust_bundles", typed(sds.SPIFFEValidatorName, &tlsv3.SPIFFECertValidatorConfig{TrustBundles: inlineBytes([]byte("{}"))}), nil, "trust_bundles"},
		{"other validator", typed("envoy.tls.cert_validator.default", &tlsv3.SPIFFECertValidatorConfig{}), nil, "validator"},
		{"other typed config", typed(sds.SPIFFEValidatorName, &tlsv3.Secret{}), nil, "validator config type"},
		{"plain ALL", secretAny(t, &tlsv3.Secret{Name: sds.AllName, Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inlineBytes(pemCerts(caA.Cert))}}}), nil, "trusted_ca"},
		{"certificate secret", secretAny(t, &tlsv3.Secret{Name: sds.AllName, Type: &tlsv3.Secret_TlsCertificate{}}), nil, "not a validation context"},
		{"unasked name", secretAny(t, &tlsv3.Secret{Name: "spiffe://b.test", Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inlineBytes(pemCerts(caB.Cert))}}}), nil, "not asked for"},
		{"other type", &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.Empty"}, nil, "type"},
		{"garbage", &anypb.Any{TypeUrl: resourcev3.SecretType, Value: []byte{0xff, 0xff}}, nil, "secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := parseValidation(tt.in, tdA)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			if v.name == sds.RootCAName {
				require.Len(t, v.roots, 1)
				return
			}
			var got []string
			for td := range v.byTD {
				got = append(got, td.Name())
			}
			assert.ElementsMatch(t, tt.wantTDs, got)
		})
	}
}

func FuzzParseValidation(f *testing.F) {
	caA, caB := testca.New(f, tdA.Name()), testca.New(f, tdB.Name())
	for _, a := range []*anypb.Any{
		allAny(f, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("b.test", pemCerts(caB.Cert))),
		allAny(f, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("a.test", pemCerts(caA.Cert))),
		allAny(f, tdEntry("spiffe://a.test", []byte("x"))),
		rootCAAny(f, pemCerts(caA.Cert, caB.Cert)),
	} {
		f.Add(a.GetValue())
	}
	// ALL with peer limits, as a server with a trust policy sends it.
	limited := &tlsv3.Secret{}
	require.NoError(f, proto.Unmarshal(allAny(f, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("b.test", pemCerts(caB.Cert))).GetValue(), limited))
	limited.GetValidationContext().MatchTypedSubjectAltNames = []*tlsv3.SubjectAltNameMatcher{
		uriMatcher("spiffe://a.test/", true), uriMatcher("spiffe://b.test/ns/billing/sa/api", false), uriMatcher("spiffe://b.test/ns/ops/", true)}
	f.Add(secretAny(f, limited).GetValue())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := parseValidation(&anypb.Any{TypeUrl: resourcev3.SecretType, Value: data}, tdA)
		if err != nil {
			return
		}
		switch v.name {
		case sds.AllName:
			if len(v.byTD) == 0 {
				t.Fatal("ALL accepted without trust domains")
			}
			for td := range v.limits {
				if _, ok := v.byTD[td]; !ok {
					t.Fatalf("peer limits for %q, which ALL does not carry", td.Name())
				}
			}
			if _, err := relayedPolicy(tdA, workload, "fuzz", v.limits); err != nil {
				t.Fatalf("accepted peer limits do not compile: %v", err)
			}
			for td, roots := range v.byTD {
				if td.IsZero() || len(roots) == 0 {
					t.Fatalf("trust domain %q accepted with %d roots", td.Name(), len(roots))
				}
				for _, r := range roots {
					if !r.IsCA {
						t.Fatal("non-CA root accepted")
					}
				}
			}
		case sds.RootCAName:
			if len(v.roots) == 0 {
				t.Fatal("ROOTCA accepted without roots")
			}
		default:
			t.Fatalf("accepted resource %q", v.name)
		}
	})
}
