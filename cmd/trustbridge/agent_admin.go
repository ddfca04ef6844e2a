package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/admin"
)

// agentAdminOptions are the agent's admin listener flags.
type agentAdminOptions struct {
	listen string
	hosts  []string
	conns  server.ConnLimits
}

// addAgentAdminFlags registers the agent's admin listener flags. Off by
// default: the agent runs beside a workload, often next to an Istio agent
// (15020, 15021) or several to a node, where an unasked-for port collides.
func addAgentAdminFlags(f *pflag.FlagSet, o *agentAdminOptions) {
	f.StringVar(&o.listen, "admin-listen", "", `address of the agent's admin HTTP listener (/healthz; /readyz: 200 once SDS serves a certificate; /metrics), e.g. 127.0.0.1:15022; "" (the default): none`)
	f.StringSliceVar(&o.hosts, server.AdminHostsFlag, nil, "more host names the admin listener is reached by, NAME or NAME:PORT; a request naming another host gets 421, as on the server's (repeatable)")
	server.AdminLimits.AddFlags(f, &o.conns, "admin", "the kubelet's probes and Prometheus", "")
}

// agentHUPIgnored says why the agent has nothing to reload on SIGHUP.
const agentHUPIgnored = "credential files are re-read every --credentials-poll-interval and the token file at every use"

// agentReadiness is what the admin listener asks for /readyz.
type agentReadiness interface{ Ready() error }

// startAgentSide starts, beside the agent, what the process adds to it:
// the admin listener (with --admin-listen) and the SIGHUP handler, which
// has nothing to reload. The returned stop ends them and waits.
func startAgentSide(ctx context.Context, e cli.Env, o agentAdminOptions, a agentReadiness, reg *prometheus.Registry, logger *slog.Logger) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = server.ServeReloads(ctx, e.HUP, nil, agentHUPIgnored, logger)
	}()
	if o.listen == "" {
		return stop, nil
	}
	ln, hosts, err := server.ListenAdmin(server.Config{AdminListen: o.listen, AdminHosts: o.hosts, AdminConns: o.conns}, reg, logger)
	if err != nil {
		stop()
		return nil, err
	}
	srv := server.NewAdminServer(hosts.Wrap(admin.Probes(a.Ready, reg)), logger)
	logger.Info("admin listening", logattr.Address, ln.Addr().String(), "paths", "/healthz /readyz /metrics")
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := server.ServeAdmin(ctx, srv, ln); err != nil {
			logger.Error("admin listener stopped", logattr.Error, err)
		}
	}()
	return stop, nil
}
