package agent

import (
	"context"
	"log/slog"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/admin"
)

// AdminConfig are the agent's admin listener flags.
type AdminConfig struct {
	Listen string
	Hosts  []string
	Conns  server.ConnLimits
}

// agentHUPIgnored says why the agent has nothing to reload on SIGHUP.
const agentHUPIgnored = "credential files are re-read every --credentials-poll-interval and the token file at every use"

// Readiness is what the admin listener asks for /readyz.
type Readiness interface{ Ready() error }

// StartSide starts, beside the agent, what the process adds to it:
// the admin listener (with --admin-listen) and the SIGHUP handler, which
// has nothing to reload. The returned stop ends them and waits.
func StartSide(ctx context.Context, hup <-chan os.Signal, o AdminConfig, a Readiness, reg *prometheus.Registry, logger *slog.Logger) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = server.ServeReloads(ctx, hup, nil, agentHUPIgnored, logger)
	}()
	if o.Listen == "" {
		return stop, nil
	}
	ln, hosts, err := server.ListenAdmin(server.Config{AdminListen: o.Listen, AdminHosts: o.Hosts, AdminConns: o.Conns}, reg, logger)
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
