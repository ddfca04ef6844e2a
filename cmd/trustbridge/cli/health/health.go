package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/sds"
)

// checkTimeout bounds one check: a probe that hangs is a failed one.
const checkTimeout = 10 * time.Second

// NewCmd is trustbridge healthcheck: the server's /readyz (/healthz with
// --shallow) on its admin socket or listener.
func NewCmd(e cli.Env) *cobra.Command {
	var (
		c       cli.AdminClient
		shallow bool
	)
	cmd := &cobra.Command{
		Use:   "healthcheck [--shallow] [--admin ADDR | --data-dir DIR]",
		Short: "Check that the server is live and ready: exit 0, or 1 saying why not",
		Long: `Ask the running server whether it is ready (GET /readyz), or only whether it
is live with --shallow (GET /healthz), as spire-server healthcheck does.
Prints "server is ready" (or "server is live") and exits 0; otherwise exits
1 with the reason: not reachable, or not ready and what it waits for (a CA
that cannot sign yet, an upstream authority that refuses, a replica that is
not the leader's follower yet).

The server is found as every admin command finds it: its admin socket in
--data-dir (default ./data) when one answers there, else --admin (default
http://127.0.0.1:15014). Neither needs the admin token.`,
		Example: `  trustbridge healthcheck
  trustbridge healthcheck --shallow --data-dir /var/lib/trustbridge/data
  trustbridge healthcheck --admin http://127.0.0.1:15014 || journalctl -u trustbridge`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, what := "/readyz", "ready"
			if shallow {
				path, what = "/healthz", "live"
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), checkTimeout)
			defer cancel()
			_, err := cli.AdminFrom(cmd, &c).Do(ctx, http.MethodGet, path, nil, false)
			if err != nil {
				return notHealthy("server", what, err)
			}
			fmt.Fprintf(e.Out, "server is %s\n", what)
			return nil
		},
	}
	f := cmd.Flags()
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	f.StringVar(&c.DataDir, "data-dir", "./data", "the server's --data-dir, where its admin socket is")
	f.BoolVar(&shallow, "shallow", false, "check liveness only (/healthz): the process answers, whether or not it is ready")
	return cmd
}

// notHealthy is the error of a failed check: the server's own reason when
// it answered, else why it could not be asked.
func notHealthy(who, what string, err error) error {
	var ae *cli.AdminError
	if errors.As(err, &ae) {
		reason := strings.TrimPrefix(ae.Message, "not ready: ")
		return fmt.Errorf("%s is not %s: %s (%s)", who, what, reason, ae.Status)
	}
	return fmt.Errorf("%s is not %s: %w", who, what, err)
}

// NewAgentCmd is trustbridge agent healthcheck: the agent's admin
// listener when given, else its SDS socket (sdsSocket is the agent's
// default).
func NewAgentCmd(e cli.Env, sdsSocket string) *cobra.Command {
	var (
		c       cli.AdminClient
		socket  string
		shallow bool
	)
	cmd := &cobra.Command{
		Use:   "healthcheck [--shallow] [--sds-socket PATH | --admin http://HOST:PORT]",
		Short: "Check that the node agent is live and serves a certificate: exit 0, or 1 saying why not",
		Long: `Ask the running node agent whether it is ready, or only live with --shallow,
as spire-agent healthcheck does. Prints "agent is ready" (or "agent is
live") and exits 0; otherwise exits 1 with the reason.

Without --admin the agent's SDS socket is asked: live when it accepts a
connection, ready when it serves the workload's certificate ("default")
within 10 seconds. With --admin, the agent's --admin-listen address, its
/readyz (200 once SDS serves a certificate) or /healthz is asked instead.
Run it as the agent's user (the socket is mode 0600) with the agent's
--sds-socket, or from the agent's working directory for the default. A node
agent (--identity-map) attests each caller of its socket and has no
certificate for this one: ask its --admin-listen with --admin.`,
		Example: `  trustbridge agent healthcheck
  trustbridge agent healthcheck --sds-socket /run/trustbridge/sds.sock --shallow
  trustbridge agent healthcheck --admin http://127.0.0.1:15022`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			what := "ready"
			if shallow {
				what = "live"
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), checkTimeout)
			defer cancel()
			var err error
			if c.Addr != "" {
				err = agentProbe(ctx, &c, shallow)
			} else {
				err = sdsProbe(ctx, socket, shallow)
			}
			if err != nil {
				return notHealthy("agent", what, err)
			}
			fmt.Fprintf(e.Out, "agent is %s\n", what)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "sds-socket", sdsSocket, "the agent's --sds-socket")
	f.StringVar(&c.Addr, "admin", "", `the agent's --admin-listen as http://HOST:PORT: ask its /readyz or /healthz instead of the socket; "" (the default): the socket`)
	f.BoolVar(&shallow, "shallow", false, "check liveness only: the socket accepts a connection (or /healthz answers)")
	return cmd
}

// agentProbe asks the agent's admin listener.
func agentProbe(ctx context.Context, c *cli.AdminClient, shallow bool) error {
	path := "/readyz"
	if shallow {
		path = "/healthz"
	}
	_, err := c.Do(ctx, http.MethodGet, path, nil, false)
	return err
}

// sdsProbe connects to the SDS socket and, unless shallow, fetches the
// workload's certificate from it.
func sdsProbe(ctx context.Context, socket string, shallow bool) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("--sds-socket: %w (is the agent running, and is this its socket?)", err)
	}
	_ = conn.Close()
	if shallow {
		return nil
	}
	cc, err := grpc.NewClient("passthrough:///sds",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		return fmt.Errorf("--sds-socket %s: %w", socket, err)
	}
	defer cc.Close()
	res, err := secretv3.NewSecretDiscoveryServiceClient(cc).FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: "trustbridge-healthcheck"},
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: []string{sds.DefaultName},
	})
	if err != nil {
		return fmt.Errorf("no certificate served on %s: %s", socket, status.Convert(err).Message())
	}
	if len(res.GetResources()) == 0 {
		return fmt.Errorf("no certificate served on %s yet", socket)
	}
	return nil
}
