package agentapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

// NewCmd is trustbridge agent api; defaultSocket is the agent's default
// --workload-api-socket.
func NewCmd(e cli.Env, defaultSocket string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "api",
		Short: "Fetch SVIDs and bundles from a Workload API socket, and validate JWT-SVIDs there, as a workload does",
		Long: `Talk to a SPIFFE Workload API socket as the workload behind it would, with
go-spiffe's client (spire-agent api): what the agent hands this process, its
X509-SVIDs, JWT-SVIDs and bundles, and whether it accepts a JWT-SVID. Use it
to check an agent from inside a pod or on a VM.

The socket is --socket-path (a path, or a unix:// or tcp:// address), else
SPIFFE_ENDPOINT_SOCKET, else the agent's default --workload-api-socket
(` + defaultSocket + `).`,
		Example: `  trustbridge agent api fetch x509
  trustbridge agent api fetch jwt --audience https://api.example.com
  trustbridge agent api fetch bundles -o json
  trustbridge agent api validate jwt --audience https://api.example.com - < token.jwt`,
		Args: cobra.NoArgs,
	}
	fetch := &cobra.Command{
		Use:   "fetch",
		Short: "Fetch X509-SVIDs, JWT-SVIDs or bundles from the Workload API",
		Example: `  trustbridge agent api fetch x509 --write ./svids
  trustbridge agent api fetch jwt --audience https://api.example.com --socket-path /run/spire/sockets/agent.sock`,
		Args: cobra.NoArgs,
	}
	fetch.AddCommand(newFetchX509Cmd(e, defaultSocket), newFetchJWTCmd(e, defaultSocket), newFetchBundlesCmd(e, defaultSocket))
	validate := &cobra.Command{
		Use:     "validate",
		Short:   "Validate a JWT-SVID with the Workload API",
		Example: `  printf '%s' "$TOKEN" | trustbridge agent api validate jwt --audience https://api.example.com -`,
		Args:    cobra.NoArgs,
	}
	validate.AddCommand(newValidateJWTCmd(e, defaultSocket))
	cmd.AddCommand(fetch, validate)
	return cmd
}

// conn is where the Workload API is and how long to wait for it.
type conn struct {
	socket        string
	defaultSocket string
	timeout       time.Duration
}

func (c *conn) addFlags(cmd *cobra.Command, defaultSocket string) {
	c.defaultSocket = defaultSocket
	f := cmd.Flags()
	f.StringVar(&c.socket, "socket-path", "", "the Workload API socket: a path, or a unix:// or tcp:// address (default: SPIFFE_ENDPOINT_SOCKET, else "+defaultSocket+")")
	f.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long to wait for the answer")
}

// addr is the Workload API address go-spiffe dials: --socket-path, else
// SPIFFE_ENDPOINT_SOCKET, else the agent's default; a path made an
// absolute unix:// address.
func (c *conn) addr() (string, error) {
	raw, from := c.socket, "--socket-path"
	if raw == "" {
		if env, ok := workloadapi.GetDefaultAddress(); ok && env != "" {
			raw, from = env, workloadapi.SocketEnv
		} else {
			raw, from = c.defaultSocket, "the default socket"
		}
	}
	if !strings.Contains(raw, "://") {
		abs, err := filepath.Abs(raw)
		if err != nil {
			return "", fmt.Errorf("%s %q: %w", from, raw, err)
		}
		raw = "unix://" + abs
	}
	if err := workloadapi.ValidateAddress(raw); err != nil {
		return "", fmt.Errorf("%s %q: %w (want a path, unix:///ABSOLUTE/PATH or tcp://IP:PORT)", from, raw, err)
	}
	return raw, nil
}

// client dials the Workload API; close it with the returned function.
func (c *conn) client(ctx context.Context) (*workloadapi.Client, string, error) {
	if c.timeout <= 0 {
		return nil, "", fmt.Errorf("--timeout %s must be positive", c.timeout)
	}
	addr, err := c.addr()
	if err != nil {
		return nil, "", err
	}
	client, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		return nil, "", fmt.Errorf("the Workload API at %s: %w", addr, err)
	}
	return client, addr, nil
}

// open connects to the Workload API and bounds the calls made with the
// returned context by --timeout; done closes both.
func (c *conn) open(ctx context.Context) (_ context.Context, _ *workloadapi.Client, addr string, done func(), _ error) {
	client, addr, err := c.client(ctx)
	if err != nil {
		return nil, nil, "", nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return ctx, client, addr, func() { cancel(); _ = client.Close() }, nil
}

// callError says what a failed call means for the operator: nobody
// listening, the agent refusing this process, or the agent's own word.
func callError(addr, what string, timeout time.Duration, err error) error {
	st, _ := status.FromError(err)
	switch {
	case errors.Is(err, context.DeadlineExceeded) || st.Code() == codes.DeadlineExceeded:
		return fmt.Errorf("the Workload API at %s gave no %s within --timeout %s: is an agent serving it, and does it have an identity for this process yet?", addr, what, timeout)
	case st.Code() == codes.Unavailable:
		return fmt.Errorf("the Workload API at %s is not reachable (%s): is the agent running, and is this its --workload-api-socket? Set --socket-path or SPIFFE_ENDPOINT_SOCKET", addr, cli.Printable(st.Message()))
	case st.Code() == codes.PermissionDenied:
		return fmt.Errorf("the agent at %s refused this process %s: %s", addr, what, cli.Printable(st.Message()))
	}
	return fmt.Errorf("the Workload API at %s: %s: %s", addr, what, cli.Printable(err.Error()))
}

// BundleOutput is one trust domain's bundle as the agent serves it:
// its authorities counted (nil: that kind was not fetched).
type BundleOutput struct {
	TrustDomain string `json:"trust_domain"`
	X509        *int   `json:"x509_authorities,omitempty"`
	JWT         *int   `json:"jwt_authorities,omitempty"`
}

// bundlesTable prints bundles, one trust domain a row.
func bundlesTable(w io.Writer, bundles []BundleOutput) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TRUST DOMAIN\tX.509 AUTHORITIES\tJWT AUTHORITIES")
	count := func(n *int) string {
		if n == nil {
			return "-"
		}
		return fmt.Sprint(*n)
	}
	for _, b := range bundles {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", cli.Printable(b.TrustDomain), count(b.X509), count(b.JWT))
	}
	return tw.Flush()
}

// stamp is how times print in tables.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// orNone is s, or "-" for none.
func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return cli.Printable(s)
}
