package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
	"github.com/trustbridge/trustbridge/sds"
)

// Limits on what the server may send the relay.
const (
	// maxRelayResponse bounds one DiscoveryResponse.
	maxRelayResponse = 16 << 20
	// maxRelayResources bounds the resources of one response; two are
	// asked for.
	maxRelayResources = 8
	// maxTrustDomains bounds the trust domains of ALL.
	maxTrustDomains = 1024
	// maxBundlePEM bounds one trust domain's PEM roots.
	maxBundlePEM = 1 << 20
)

// spiffeValidatorType is the type URL of ALL's validator configuration.
const spiffeValidatorType = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig"

// relay subscribes to ALL and ROOTCA on the server's SDS and publishes
// what it gets into the local trust: the server pushes, so a federation
// change reaches the local SDS streams without polling. A response that
// does not parse is NACKed and the last good trust stays, across
// reconnects too.
type relay struct {
	addr        string
	tlsConfig   func() *tls.Config
	trust       *sds.TrustCell
	serverRoots func([]*x509.Certificate)
	local       spiffeid.TrustDomain
	nodeID      string
	// id is the workload's; policy holds the server's decision for it
	// (the peer limits of ALL) as the local SDS server's policy.
	id     spiffeid.ID
	policy *trustpolicy.Cell
	// seed is the trust before the server said anything: the roots the
	// agent was configured with.
	seed    map[spiffeid.TrustDomain][]*x509.Certificate
	clock   clock.Clock
	log     *slog.Logger
	metrics *metrics
	retry   loop.Backoff

	// Last good resources; nil until received.
	all    map[spiffeid.TrustDomain][]*x509.Certificate
	rootCA []*x509.Certificate
	// limits are ALL's peer limits, published in policy; nil until ALL
	// arrives.
	limits peerLimits
	// published is the trust last Set, to skip identical updates.
	published map[spiffeid.TrustDomain][]*x509.Certificate
	// relayed, when not nil, is closed once the server's ALL has been
	// published, so the agent can wait for the whole trust before it
	// serves Envoy.
	relayed     chan struct{}
	relayedOnce sync.Once
}

// Run streams until ctx is done, reconnecting with capped exponential
// backoff and jitter. It returns nil when ctx is done.
func (r *relay) Run(ctx context.Context) error {
	failures := 0
	for {
		progressed, err := r.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if progressed {
			failures = 0
		}
		failures++
		d := r.retry.Delay(failures, rand.Float64())
		r.metrics.relayStreamErrs.Inc()
		r.log.Warn("SDS stream to the server failed; keeping the last good trust and retrying",
			"ca_addr", r.addr, logattr.Error, err.Error(), "retry_in", d)
		t := r.clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// retryJitter spreads the agent's retries over ±20% of each delay, so
// the agents of a fleet that lost the server together do not come back
// together.
const retryJitter = 0.2

// stream runs one SDS stream. progressed reports whether a response was
// accepted on it.
func (r *relay) stream(ctx context.Context) (progressed bool, err error) {
	conn, err := grpc.NewClient(r.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(r.tlsConfig())),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRelayResponse)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		return false, err
	}
	req := &discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: r.nodeID, Cluster: "trustbridge-agent", UserAgentName: "trustbridge-agent"},
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: []string{sds.AllName, sds.RootCAName},
	}
	if err := st.Send(req); err != nil {
		return false, err
	}
	r.metrics.relayConnected.Set(1)
	defer r.metrics.relayConnected.Set(0)
	version := ""
	for {
		resp, err := st.Recv()
		if err != nil {
			return progressed, err
		}
		next := &discoveryv3.DiscoveryRequest{
			TypeUrl:       resourcev3.SecretType,
			ResourceNames: req.ResourceNames,
			ResponseNonce: resp.GetNonce(),
		}
		if err := r.apply(resp); err != nil {
			r.metrics.relayResponses.WithLabelValues(resultFailure).Inc()
			r.log.Warn("server sent validation contexts that do not parse; NACKed, keeping the last good trust",
				"ca_addr", r.addr, "version", resp.GetVersionInfo(), logattr.Error, err.Error())
			next.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		} else {
			r.metrics.relayResponses.WithLabelValues(resultSuccess).Inc()
			version = resp.GetVersionInfo()
			progressed = true
		}
		next.VersionInfo = version
		if err := st.Send(next); err != nil {
			return progressed, err
		}
	}
}

// apply validates every resource of resp and, only if all are valid,
// publishes the resulting trust.
func (r *relay) apply(resp *discoveryv3.DiscoveryResponse) error {
	if resp.GetTypeUrl() != resourcev3.SecretType {
		return fmt.Errorf("response type %q, want %q", resp.GetTypeUrl(), resourcev3.SecretType)
	}
	res := resp.GetResources()
	if len(res) > maxRelayResources {
		return fmt.Errorf("%d resources in one response; at most %d are accepted", len(res), maxRelayResources)
	}
	var (
		all     map[spiffeid.TrustDomain][]*x509.Certificate
		limits  peerLimits
		rootCA  []*x509.Certificate
		seenAll bool
		seenCA  bool
	)
	for i, a := range res {
		v, err := parseValidation(a, r.local)
		if err != nil {
			return fmt.Errorf("resource %d: %w", i, err)
		}
		switch v.name {
		case sds.AllName:
			if seenAll {
				return fmt.Errorf("resource %d: %s twice", i, sds.AllName)
			}
			seenAll, all, limits = true, v.byTD, v.limits
		case sds.RootCAName:
			if seenCA {
				return fmt.Errorf("resource %d: %s twice", i, sds.RootCAName)
			}
			seenCA, rootCA = true, v.roots
		}
	}
	if seenAll {
		// The policy goes first: a trust domain the server now limits or
		// took away must not be served unlimited in between. It is
		// compiled only when the limits changed.
		if r.limits == nil || !maps.EqualFunc(r.limits, limits, slices.Equal) {
			pol, err := relayedPolicy(r.local, r.id, "server:"+r.addr, limits)
			if err != nil {
				return fmt.Errorf("%s: peer limits: %w", sds.AllName, err)
			}
			r.policy.Set(pol)
			r.limits = limits
		}
		r.all = all
	}
	if seenCA {
		r.rootCA = rootCA
	}
	r.publish()
	return nil
}

// publish sets the trust from the last good resources: ALL's trust
// domains (the seed until ALL arrives), with the local trust domain's
// roots from ROOTCA when it arrived, and those it served before (see
// below).
func (r *relay) publish() {
	m := r.wanted()
	if sameRoots(m, r.published) {
		r.markRelayed()
		return
	}
	// Set refuses only nil bundles and duplicate trust domains, which a
	// map cannot hold.
	if err := r.trust.Set(bundlesOf(m)); err != nil {
		r.log.Error("publishing relayed trust", logattr.Error, err.Error())
		return
	}
	r.published = m
	r.markRelayed()
	if roots := m[r.local]; len(roots) > 0 {
		r.serverRoots(slices.Clone(roots))
	}
	r.log.Info("trust updated from the server", "trust_domains", len(m))
}

// wanted is the local trust the server's last answers call for: ALL (or
// the seed before it), ROOTCA as the local roots, and every trust domain
// served before.
func (r *relay) wanted() map[spiffeid.TrustDomain][]*x509.Certificate {
	m := maps.Clone(r.all)
	if m == nil {
		m = maps.Clone(r.seed)
	}
	if m == nil {
		m = make(map[spiffeid.TrustDomain][]*x509.Certificate)
	}
	if r.rootCA != nil {
		m[r.local] = r.rootCA
	} else if _, ok := m[r.local]; !ok && len(r.seed[r.local]) > 0 {
		m[r.local] = r.seed[r.local]
	}
	// A trust domain served before and absent from ALL now stays in the
	// local trust, where the policy (which grants only ALL's) denies it:
	// Envoy keeps an SDS resource the server stops naming, so its
	// spiffe://<td> must be answered with the denial, not fall silent.
	for td, roots := range r.published {
		if _, ok := m[td]; !ok && len(m) < maxTrustDomains {
			m[td] = roots
		}
	}
	return m
}

// markRelayed says, once, that the server's ALL has been published.
func (r *relay) markRelayed() {
	if r.all != nil && r.relayed != nil {
		r.relayedOnce.Do(func() { close(r.relayed) })
	}
}

func sameRoots(a, b map[spiffeid.TrustDomain][]*x509.Certificate) bool {
	if b == nil || len(a) != len(b) {
		return false
	}
	for td, ra := range a {
		rb, ok := b[td]
		if !ok || !slices.EqualFunc(ra, rb, func(x, y *x509.Certificate) bool { return bytes.Equal(x.Raw, y.Raw) }) {
			return false
		}
	}
	return true
}

// validation is one parsed validation-context resource.
type validation struct {
	name   string                                       // sds.AllName or sds.RootCAName
	byTD   map[spiffeid.TrustDomain][]*x509.Certificate // ALL
	limits peerLimits                                   // ALL
	roots  []*x509.Certificate                          // ROOTCA
}

// parseValidation parses a relayed resource, untrusted input: a Secret
// named ALL holding Envoy's SPIFFE validator configuration, or named
// ROOTCA holding a trusted_ca. Every trust domain name must be canonical
// and unique, and every bundle inline PEM of CA certificates; file and
// environment data sources are refused (the server must not make the
// agent read local files).
func parseValidation(a *anypb.Any, local spiffeid.TrustDomain) (*validation, error) {
	if a.GetTypeUrl() != resourcev3.SecretType {
		return nil, fmt.Errorf("type %q, want %q", a.GetTypeUrl(), resourcev3.SecretType)
	}
	var s tlsv3.Secret
	if err := proto.Unmarshal(a.GetValue(), &s); err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	vc := s.GetValidationContext()
	if vc == nil {
		return nil, fmt.Errorf("secret %q is not a validation context", s.GetName())
	}
	switch s.GetName() {
	case sds.RootCAName:
		if vc.GetCustomValidatorConfig() != nil {
			return nil, fmt.Errorf("%s: unexpected custom validator", sds.RootCAName)
		}
		roots, err := parseRootsSource(vc.GetTrustedCa())
		if err != nil {
			return nil, fmt.Errorf("%s: trusted_ca: %w", sds.RootCAName, err)
		}
		return &validation{name: sds.RootCAName, roots: roots}, nil
	case sds.AllName:
		byTD, err := parseSPIFFEValidator(vc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sds.AllName, err)
		}
		limits, err := parseSANMatchers(vc.GetMatchTypedSubjectAltNames(), byTD, local)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sds.AllName, err)
		}
		return &validation{name: sds.AllName, byTD: byTD, limits: limits}, nil
	default:
		return nil, fmt.Errorf("secret %q was not asked for", s.GetName())
	}
}

func parseSPIFFEValidator(vc *tlsv3.CertificateValidationContext) (map[spiffeid.TrustDomain][]*x509.Certificate, error) {
	if vc.GetTrustedCa() != nil {
		return nil, errors.New("trusted_ca set next to the SPIFFE validator")
	}
	cv := vc.GetCustomValidatorConfig()
	if cv == nil {
		return nil, errors.New("no custom_validator_config")
	}
	if cv.GetName() != sds.SPIFFEValidatorName {
		return nil, fmt.Errorf("validator %q, want %q", cv.GetName(), sds.SPIFFEValidatorName)
	}
	if cv.GetTypedConfig().GetTypeUrl() != spiffeValidatorType {
		return nil, fmt.Errorf("validator config type %q, want %q", cv.GetTypedConfig().GetTypeUrl(), spiffeValidatorType)
	}
	var cfg tlsv3.SPIFFECertValidatorConfig
	if err := proto.Unmarshal(cv.GetTypedConfig().GetValue(), &cfg); err != nil {
		return nil, fmt.Errorf("validator config: %w", err)
	}
	if cfg.GetTrustBundles() != nil {
		return nil, errors.New("trust_bundles is not supported; want trust_domains")
	}
	tds := cfg.GetTrustDomains()
	if len(tds) == 0 {
		return nil, errors.New("no trust_domains")
	}
	if len(tds) > maxTrustDomains {
		return nil, fmt.Errorf("%d trust domains; at most %d are accepted", len(tds), maxTrustDomains)
	}
	out := make(map[spiffeid.TrustDomain][]*x509.Certificate, len(tds))
	for i, e := range tds {
		td, err := spiffeid.TrustDomainFromString(e.GetName())
		if err != nil {
			return nil, fmt.Errorf("trust domain %d (%q): %w", i, e.GetName(), err)
		}
		if td.Name() != e.GetName() {
			return nil, fmt.Errorf("trust domain %d (%q): want the bare name %q", i, e.GetName(), td.Name())
		}
		if _, dup := out[td]; dup {
			return nil, fmt.Errorf("trust domain %d (%q): listed twice", i, e.GetName())
		}
		roots, err := parseRootsSource(e.GetTrustBundle())
		if err != nil {
			return nil, fmt.Errorf("trust domain %d (%q): %w", i, e.GetName(), err)
		}
		out[td] = roots
	}
	return out, nil
}

// parseRootsSource parses inline PEM CA certificates, at least one.
func parseRootsSource(ds *corev3.DataSource) ([]*x509.Certificate, error) {
	var data []byte
	switch s := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		data = s.InlineBytes
	case *corev3.DataSource_InlineString:
		data = []byte(s.InlineString)
	case nil:
		return nil, errors.New("no roots")
	default:
		return nil, fmt.Errorf("data source %T is not inline", s)
	}
	if len(data) > maxBundlePEM {
		return nil, fmt.Errorf("%d bytes of roots; at most %d are accepted", len(data), maxBundlePEM)
	}
	roots, err := pemfile.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	for i, c := range roots {
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, fmt.Errorf("certificate %d is not a CA certificate", i)
		}
	}
	return roots, nil
}
