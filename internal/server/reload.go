package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// reloader re-reads one part of the configuration; it returns what it
// applied, and on error keeps what was in force.
type reloader struct {
	name   string
	reload func() (string, error)
}

// notReloadable is what a reload never changes, for the log.
const notReloadable = "flags, environment variables and the --config file's other settings (restart to change them)"

// ServeReloads runs every reloader on each signal from hup until ctx is
// done; with none, it logs that the signal is ignored and why (idle). A
// nil hup never delivers.
func ServeReloads(ctx context.Context, hup <-chan os.Signal, rs []reloader, idle string, logger *slog.Logger) error {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.name
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
		}
		if len(rs) == 0 {
			logger.Info("SIGHUP ignored: nothing here is reloadable", "reason", idle)
			continue
		}
		logger.Info("SIGHUP: reloading", "reloadable", names, "not_reloadable", notReloadable)
		for _, r := range rs {
			if what, err := r.reload(); err != nil {
				logger.Error("reload failed; the previous configuration stays in force", "part", r.name, logattr.Error, err)
			} else {
				logger.Info("reloaded", "part", r.name, "applied", what)
			}
		}
	}
}

// reloadRunner is the server's SIGHUP handler: it reloads the federation
// list of --federation-config or of the --config file, the bootstrap
// token file, the bundle endpoint's --bundle-file and --bundle-tls-cert
// files, the --ca-dir plug-in CA and the trust policy of --trust-policy
// and of the --config file (the token, bundle, --ca-dir and
// --trust-policy files are also polled: SIGHUP makes it now).
func (p *serverParts) reloadRunner(hup <-chan os.Signal, o Config, logger *slog.Logger) func(context.Context) error {
	var rs []reloader
	if p.fed.poller != nil && (o.Federation.ConfigFile != "" || o.ConfigPath != "") {
		rs = append(rs, reloader{name: "federation", reload: func() (string, error) {
			return reloadFederation(o, p.td, p.fed, p.crd != nil, logger)
		}})
	}
	if p.gs != nil && p.gs.tokens != nil {
		tokens := p.gs.tokens
		rs = append(rs, reloader{name: "bootstrap tokens", reload: func() (string, error) {
			if err := tokens.Reload(); err != nil {
				return "", fmt.Errorf("--bootstrap-token-file: %w", err)
			}
			return fmt.Sprintf("%d tokens in force", tokens.Len()), nil
		}})
	}
	if p.ep != nil {
		rs = append(rs, p.ep.reloads...)
	}
	if w := p.authority.Plugin(); w != nil {
		rs = append(rs, checkReloader("--ca-dir", w.Check))
	}
	rs = append(rs, p.policy.reloader()...)
	if p.idmap != nil && p.idmap.file != nil {
		rs = append(rs, checkReloader("--identity-map", p.idmap.file.Check))
	}
	idle := "no --federation-config, --config, --bootstrap-token-file, --bundle-file, --bundle-tls-cert, --ca-dir, --trust-policy or --identity-map"
	return func(ctx context.Context) error { return ServeReloads(ctx, hup, rs, idle, logger) }
}

// checkReloader re-reads a watched file now with its watcher's Check,
// which keeps the last good content when the new one is invalid.
func checkReloader(name string, check func() error) reloader {
	return reloader{name: name, reload: func() (string, error) {
		if err := check(); err != nil {
			return "", err
		}
		return "re-read", nil
	}}
}

// reloadFederation reads the endpoints of flags and files again, checks
// them as at start (with what the store and the poller hold now), and
// applies them with the resources' through federationSetup.setStatic. On
// error the endpoints in force stay.
func reloadFederation(o Config, td spiffeid.TrustDomain, fed *federationSetup, withCRD bool, logger *slog.Logger) (string, error) {
	fo := o.Federation
	if o.ConfigPath != "" {
		list, err := configFederationList(o.ConfigPath)
		if err != nil {
			return "", err
		}
		if list != nil && fo.ConfigFile != "" {
			return "", fmt.Errorf("config %s: a federation list and --federation-config do not combine; keep one", o.ConfigPath)
		}
		fo.inline, fo.inlineFrom = list, o.ConfigPath
	}
	// The poller's Holds reads the last-known-good store too.
	fromFlag, fromFile, warnings, err := StaticEndpoints(fo, td, fed.holds)
	if err != nil {
		return "", err
	}
	for _, w := range warnings {
		logger.Warn("federation config", logattr.Warning, w)
	}
	if withCRD {
		// The resources were judged against the trust domains of flags and
		// files at start (reserved for them); that set stays until restart.
		old, _ := fed.staticSet()
		if !slices.Equal(trustDomainsOf(old), trustDomainsOf(slices.Concat(fromFlag, fromFile))) {
			return "", errors.New("with --federation-crd a reload may change the endpoints of the trust domains flags and files configure, not add or remove trust domains: restart for that")
		}
	}
	if err := fed.setStatic(fromFlag, fromFile); err != nil {
		return "", err
	}
	logPeers(fed, logger)
	return fmt.Sprintf("%d federated trust domains from flags and files", len(fromFlag)+len(fromFile)), nil
}

// configFederationList is the federation list of the --config file at
// path, nil when it has none. The whole file is checked as at start, on a
// scratch flag set: its other settings are not applied.
func configFederationList(path string) (*yaml.Node, error) {
	cf, err := rereadConfig(path)
	if err != nil {
		return nil, err
	}
	return cf.federation, nil
}

// trustDomainsOf is the sorted trust domain names of eps.
func trustDomainsOf(eps []federation.Endpoint) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = ep.TrustDomain.Name()
	}
	slices.Sort(out)
	return out
}
