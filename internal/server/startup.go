package server

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// announce says the server started: always as start-up records on the
// log, and, when the log is text (--log-format text, or auto on a
// terminal), also as the banner on standard output, a quick start for the
// person reading it. With JSON logs there is no banner: a log pipeline
// (kubectl logs merges standard output and error) gets JSON lines only,
// and the records carry the same facts.
func announce(e env, o Config, p *serverParts, addr string, logger *slog.Logger) {
	if textLogs(e.err, o.LogFormat) {
		printBanner(e.out, o, p, addr)
		p.gs.printBanner(e.out)
	}
	logStart(o, p, addr, logger)
}

// textLogs says whether newLogger writes text to w in format.
func textLogs(w io.Writer, format string) bool {
	return format == "text" || format == "auto" && isTerminal(w)
}

// caMode says what the CA is, where its state is kept and where its keys
// are, for the banner and the log.
func caMode(o Config, kube *kubeSetup) string {
	if o.CADir != "" {
		return "plug-in CA from " + o.CADir + " (reloaded on change)"
	}
	state := kube.describe()
	if kube == nil {
		abs, _ := filepath.Abs(o.DataDir)
		state = "state in " + filepath.Join(abs, "ca")
	}
	return caKind(o.Upstream) + ", " + state + ", " + o.Keys.describe(kube != nil)
}

// caKind says what signs: a self-signed root, or an intermediate under
// the upstream authority --upstream names.
func caKind(u UpstreamConfig) string {
	switch u.Kind {
	case UpstreamTrustbridge:
		return "intermediate CA under the upstream trustbridge at " + u.Trustbridge.Address
	case upstreamKubeCSR:
		return "intermediate CA under the Kubernetes CSR signer " + u.kubeCSR.signerName
	}
	return "self-signed"
}

// logStart logs the start-up records: the server (version, trust domain,
// CA, listeners), the bundle endpoint's tuple, the certificate service,
// and one record per federated trust domain the flags and files
// configure.
func logStart(o Config, p *serverParts, addr string, logger *slog.Logger) {
	td, a := p.td, p.authority
	listeners := []any{"admin", addr}
	if p.ep != nil {
		listeners = append(listeners, "bundle", p.ep.ln.Addr().String())
	}
	if p.gs != nil {
		listeners = append(listeners, "grpc", p.gs.ln.Addr().String())
	}
	logger.Info("trustbridge server started", "version", o.version(), logattr.TrustDomain, td.Name(),
		logattr.DataDir, o.DataDir, "ca", caMode(o, p.kube), logattr.Roots, len(a.Roots()), logattr.Sequence, a.Sequence(),
		"admin", "http://"+addr, slog.Group("listeners", listeners...), adminSocketAttr(p.socket))
	if ep := p.ep; ep != nil {
		attrs := []any{logattr.EndpointURL, ep.url, "profile", o.Bundle.Profile, "tuple", ep.tuple(td)}
		if !ep.id.IsZero() {
			attrs = append(attrs, logattr.SPIFFEID, ep.id.String(), "bootstrap", ep.bootstrapCommand(td, addr))
		}
		logger.Info("bundle endpoint: peers federate with this tuple", attrs...)
	}
	logIssuers(o, p.ep, logger)
	p.gs.logStart(logger)
	logPeers(p.fed, logger)
}

// adminSocketAttr names the admin socket in the start-up record, where
// the CLI finds it (trustbridge ... --data-dir DIR); empty without one.
func adminSocketAttr(s *adminSocket) slog.Attr {
	if path := s.where(); path != "" {
		return slog.String("admin_socket", path)
	}
	return slog.Attr{}
}

// logPeers logs one record per federated trust domain of fed's flags,
// files and run-time changes, with where it is configured.
func logPeers(fed *federationSetup, logger *slog.Logger) {
	eps, origins := fed.configured()
	for _, ep := range eps {
		logger.Info("federated trust domain configured", peerAttrs(ep, origins[ep.TrustDomain])...)
	}
}

// peerAttrs are the log attributes of a configured endpoint.
func peerAttrs(ep federation.Endpoint, origin string) []any {
	attrs := []any{logattr.TrustDomain, ep.TrustDomain.Name(), logattr.EndpointURL, ep.URL.String(),
		"profile", string(ep.Profile), "origin", origin}
	if !ep.EndpointSPIFFEID.IsZero() {
		attrs = append(attrs, "endpoint_spiffe_id", ep.EndpointSPIFFEID.String())
	}
	return attrs
}

// printBanner prints the start banner: what is served, and the commands
// to try first.
func printBanner(w io.Writer, o Config, p *serverParts, addr string) {
	td, a := p.td.Name(), p.authority
	fmt.Fprintf(w, `trustbridge is serving trust domain %s
  version:    %s
  CA:         %s
  roots:      %d published, bundle sequence %d
  admin:      http://%s/healthz  /readyz  /metrics  /v1/trust  /v1/snapshot
  status:     http://%s/ui
  try:        curl -s http://%s/v1/trust
`, td, o.version(), caMode(o, p.kube), len(a.Roots()), a.Sequence(), addr, addr, addr)
	if path := p.socket.where(); path != "" {
		fmt.Fprintf(w, "  socket:     %s (admin API, no token: %s)\n", path, p.socket.howToReach(o.DataDir))
	}
	if p.kube == nil {
		// ca issue reads the state directory; with Kubernetes storage
		// certificates come from the gRPC service (ca request).
		issue := "--data-dir " + o.DataDir
		if o.CADir != "" {
			issue = "--ca-dir " + o.CADir
		}
		fmt.Fprintf(w, "              trustbridge ca issue %s --spiffe-id spiffe://%s/demo --credentials-dir ./demo-creds\n", issue, td)
	}
	if ep := p.ep; ep != nil {
		fmt.Fprintf(w, "  bundle:     %s\n  peers use:  %s\n", ep.url, ep.tuple(p.td))
		for _, iss := range ep.issuers {
			fmt.Fprintf(w, "  oidc:       %s%s   (%s)\n", iss.URL, bundleserver.DiscoveryPath, iss.TrustDomain.Name())
		}
		if cmd := ep.bootstrapCommand(p.td, addr); cmd != "" {
			// https_spiffe peers authenticate their first fetch with our
			// bundle, which they must get over a channel they trust.
			fmt.Fprintf(w, "  bootstrap:  %s   (hand it to each peer's operator over a channel you trust; SPIRE: spire-server bundle set -format spiffe -id spiffe://%s -path %s)\n",
				cmd, td, bootstrapFile(p.td))
		}
	}
	printPeers(w, p.fed)
}

// printPeers adds the configured federated trust domains to the banner:
// the same set as logPeers' records (flags, files and run-time changes).
func printPeers(w io.Writer, fed *federationSetup) {
	eps, origins := fed.configured()
	for i, ep := range eps {
		label := ""
		if i == 0 {
			label = "federates:"
		}
		fmt.Fprintf(w, "  %-11s %s %s (%s, from %s)\n", label, ep.TrustDomain.Name(), ep.URL, ep.Profile, origins[ep.TrustDomain])
	}
}

// sortedEndpoints is eps sorted by trust domain name.
func sortedEndpoints(eps []federation.Endpoint) []federation.Endpoint {
	eps = slices.Clone(eps)
	slices.SortFunc(eps, func(a, b federation.Endpoint) int { return strings.Compare(a.TrustDomain.Name(), b.TrustDomain.Name()) })
	return eps
}

// logIssuers logs the OIDC issuers served and, when our tokens carry an
// issuer nothing here serves, says so.
func logIssuers(o Config, ep *bundleEndpoint, logger *slog.Logger) {
	served := false
	if ep != nil {
		for _, iss := range ep.issuers {
			served = served || iss.local
			logger.Info("OIDC issuer served", logattr.Issuer, iss.URL, logattr.TrustDomain, iss.TrustDomain.Name(),
				"discovery", iss.URL+bundleserver.DiscoveryPath, "jwks", iss.URL+bundleserver.JWKSPath)
		}
	}
	if o.JWT.Issuer != "" && !served {
		logger.Info("JWT-SVIDs carry iss; no discovery document is served here (--bundle-listen is off): serve it from a relay with --relay-jwt-issuer", logattr.Issuer, o.JWT.Issuer)
	}
}
