package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
)

func newServerCmd(e cli.Env) *cobra.Command {
	var o server.Config
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the trust domain: embedded CA with root rotation and an admin endpoint",
		Long: `Run trustbridge for one trust domain. The first start, in an empty --data-dir
or with --init, creates a self-signed root there; later starts reuse it. A
--data-dir that does not exist, or holds files but no CA state, is refused
without --init, so a mistyped path never bootstraps a new root. One server
per data directory: a second one fails at once, naming the first (its lock
file, trustbridge.lock, records its pid and start). Roots rotate on their own: a
successor is published at half the active root's life and signs only after
5 refresh hints, so federated peers always know a root before they meet a
certificate it signed.

The admin listener serves /healthz, /readyz, /metrics (Prometheus),
/v1/trust (JSON: the published roots, their state and fingerprints),
/v1/bundle (the SPIFFE bundle document https_spiffe peers need once, to
authenticate their first fetch), /v1/federation (every federated trust domain's polling state),
/v1/snapshot (JSON: every trusted trust domain, by which authorities,
since when, from where; what trustbridge audit reads) and /ui (the same as
a read-only status page). A request whose Host header names anything but
the listener's address, localhost or an --admin-allowed-hosts name gets
421 Misdirected Request, so a web page that rebinds its own name to this
address (DNS rebinding) cannot read it.`,
		Example: `  # first start of a trust domain: --init creates ./data and its root CA
  trustbridge server --trust-domain example.org --data-dir ./data --init
  # later starts reuse ./data (--init changes nothing then)
  trustbridge server --trust-domain example.org --data-dir ./data

  # federate with an https_web peer (Istio's form) and an https_spiffe peer
  # whose bundle its operator handed over (the fourth field)
  trustbridge server --trust-domain example.org --data-dir /var/lib/trustbridge \
    --federate 'web.example|https://web.example/bundle||east.example|https://east.example:8443/|spiffe://east.example/trustbridge/bundle-endpoint|east.example.json'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Load(cmd.Flags(), os.Getenv); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			e, stopHUP := hupSignals(e)
			defer stopHUP()
			return runServer(ctx, e, o, nil)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// hupSignals is e with SIGHUP delivered on e.HUP, and the function that
// stops the delivery. SIGHUP's default action ends the process without a
// word; a command that subscribes reloads, or says it ignores it.
func hupSignals(e cli.Env) (cli.Env, func()) {
	if e.HUP != nil {
		return e, func() {}
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	e.HUP = c
	return e, func() { signal.Stop(c) }
}

// runServer runs the server of cfg with e's streams, clock and SIGHUP.
// ready, when not nil, receives the admin listener's address once the
// server serves.
func runServer(ctx context.Context, e cli.Env, cfg server.Config, ready chan<- string) error {
	cfg.Stdout, cfg.Stderr, cfg.Now, cfg.HUP, cfg.Ready = e.Out, e.Err, e.Now, e.HUP, ready
	cfg.Version = buildVersion()
	return server.New(cfg).Run(ctx)
}
