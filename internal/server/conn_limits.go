package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/server/connlimit"
)

// ConnLimits bound the connections one TCP listener holds
// (internal/server/connlimit): in total, and per source (an IPv4 address, or an
// IPv6 /64 as a whole). Zero fields take their listener's defaults.
type ConnLimits struct {
	Max, PerSource int
}

// ListenerLimits describes one TCP listener's limits: its name in metrics
// and logs, the prefix of its flags and its defaults.
type ListenerLimits struct {
	name, flag string
	def        ConnLimits
}

// The listeners' defaults. An idle connection costs about 52 KiB (issue
// 32: 5,000 idle gRPC connections took 255 MiB), so the three totals hold
// at most about 140 MiB together, under the 256 MiB memory limit of
// deploy/base and the chart with the process's own 45 MiB or so. The
// per-source limits leave room for a Kubernetes node's pods behind one
// address (SNAT) or one IPv6 /64 (a node's pod range): up to 250 pods,
// each with a sidecar and an agent connection, on the certificate service.
var (
	grpcLimits   = ListenerLimits{name: "grpc", flag: "grpc", def: ConnLimits{Max: 2048, PerSource: 512}}
	bundleLimits = ListenerLimits{name: "bundle", flag: "bundle", def: ConnLimits{Max: 512, PerSource: 64}}
	AdminLimits  = ListenerLimits{name: "admin", flag: "admin", def: ConnLimits{Max: 128, PerSource: 32}}
)

// serverMemoryNote says, in the server's --*-max-conns help, how their
// defaults fit the manifests' memory limit.
func serverMemoryNote(ll ListenerLimits) string {
	return fmt.Sprintf(": the defaults of the server's three listeners together stay under the 256 MiB memory limit of deploy/base and the chart; "+
		"raise them with the limit, e.g. this one to %d with 1Gi", 4*ll.def.Max)
}

// defaultFirstCallTimeout bounds how long a connection to the certificate
// service may go without a successful call: the 10 s the TLS and
// HTTP/2 setup may take (certservice.ConnectionTimeout), a TokenReview's
// 5 s, and as much again for a busy API server.
const defaultFirstCallTimeout = 30 * time.Second

// AddFlags registers --<flag>-max-conns and --<flag>-max-conns-per-source;
// what says what the listener serves, who says who its clients are, and
// memory (may be "") how the default fits the process's memory limit.
func (ll ListenerLimits) AddFlags(f *pflag.FlagSet, l *ConnLimits, what, who, memory string) {
	f.IntVar(&l.Max, ll.flag+"-max-conns", ll.def.Max, fmt.Sprintf(
		"connections the %s listener (--%s-listen) holds at once; a new one beyond them is closed at accept (counted in "+
			"trustbridge_listener_connections_refused_total{listener=%q,reason=\"total_limit\"}; on --grpc-listen it takes the place of one no call has confirmed yet, if any). An idle connection costs "+
			"about 52 KiB (gRPC over TLS; plain HTTP less)%s", what, ll.flag, ll.name, memory))
	f.IntVar(&l.PerSource, ll.flag+"-max-conns-per-source", ll.def.PerSource, fmt.Sprintf(
		"connections one client address (an IPv4 address, or an IPv6 /64 as a whole) may hold on --%s-listen; "+
			"beyond them its new ones are closed at accept (reason=\"source_limit\"). The default leaves room for %s",
		ll.flag, who))
}

// check refuses negative limits; zero takes the default.
func (ll ListenerLimits) check(l ConnLimits) error {
	var errs []error
	if l.Max < 0 {
		errs = append(errs, fmt.Errorf("--%s-max-conns %d: must not be negative (0 takes the default, %d)", ll.flag, l.Max, ll.def.Max))
	}
	if l.PerSource < 0 {
		errs = append(errs, fmt.Errorf("--%s-max-conns-per-source %d: must not be negative (0 takes the default, %d)", ll.flag, l.PerSource, ll.def.PerSource))
	}
	return errors.Join(errs...)
}

func (ll ListenerLimits) withDefaults(l ConnLimits) ConnLimits {
	if l.Max == 0 {
		l.Max = ll.def.Max
	}
	if l.PerSource == 0 {
		l.PerSource = ll.def.PerSource
	}
	return l
}

// listen opens addr (the value of --<flag>-listen) bounded by l.
func (ll ListenerLimits) listen(addr string, l ConnLimits, reg prometheus.Registerer, logger *slog.Logger) (*connlimit.Listener, error) {
	return ll.listenWith(addr, l, connlimit.Config{}, reg, logger)
}

// listenWith is listen with cfg's other settings (a confirmation
// deadline, a TCP user timeout).
func (ll ListenerLimits) listenWith(addr string, l ConnLimits, cfg connlimit.Config, reg prometheus.Registerer, logger *slog.Logger) (*connlimit.Listener, error) {
	if err := ll.check(l); err != nil {
		return nil, err
	}
	l = ll.withDefaults(l)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s-listen: %w", ll.flag, err)
	}
	cfg.Name, cfg.MaxConns, cfg.MaxPerSource, cfg.Logger, cfg.Registerer = ll.name, l.Max, l.PerSource, logger, reg
	if cfg.ConfirmWithin > 0 {
		cfg.MaxPending, cfg.MaxPendingPerSource = unconfirmedLimits(l)
	}
	cl, err := connlimit.New(ln, cfg)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return cl, nil
}

// unconfirmedLimits are the shares of a listener's limits that
// connections awaiting their first successful call may hold: a quarter of
// the total (at it, or at the total, a new one takes the place of the
// oldest of the source holding the most) and half a source's (a node's
// pods behind one address reconnecting at once). A client that never
// succeeds cannot then hold more than that, its calls in flight stay
// bounded (pendingStreams each), and flooding from a few sources pushes
// out its own connections, not others'.
func unconfirmedLimits(l ConnLimits) (total, perSource int) {
	return max(l.Max/4, 1), max(l.PerSource/2, 1)
}

// CheckListenerLimits checks every listener's limits and timeouts of
// trustbridge server.
func CheckListenerLimits(o Config) error {
	errs := []error{grpcLimits.check(o.GRPC.Conns), bundleLimits.check(o.Bundle.Conns), AdminLimits.check(o.AdminConns)}
	if o.GRPC.FirstCallTimeout < 0 {
		errs = append(errs, fmt.Errorf("--grpc-first-call-timeout %s: must not be negative", o.GRPC.FirstCallTimeout))
	}
	if o.Bundle.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("--bundle-idle-timeout %s: must not be negative", o.Bundle.IdleTimeout))
	}
	return errors.Join(errs...)
}
