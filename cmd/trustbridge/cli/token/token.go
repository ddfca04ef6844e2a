package token

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage the server's bootstrap tokens (--bootstrap-token-file)",
		Example: `  trustbridge token create --spiffe-id spiffe://example.org/vm/laptop --ttl 1h --file /etc/trustbridge/bootstrap-tokens
  trustbridge token list --file /etc/trustbridge/bootstrap-tokens`,
	}
	cmd.AddCommand(newTokenCreateCmd(e), newTokenListCmd(e), newTokenRevokeCmd(e))
	return cmd
}

type tokenCreateOptions struct {
	spiffeID string
	ttl      time.Duration
	reusable bool
	file     string
}

func newTokenCreateCmd(e cli.Env) *cobra.Command {
	var o tokenCreateOptions
	cmd := &cobra.Command{
		Use:   "create --spiffe-id ID [--ttl 1h] [--reusable] [--file FILE]",
		Short: "Make a fresh random bootstrap token for one identity and add it to the token file",
		Long: `Make a bootstrap token, 256 bits from the system's secure random source, for
--spiffe-id, valid for --ttl, and append its line to --file, the server's
--bootstrap-token-file (created if missing). The file is replaced atomically,
mode 0600 and keeping its owner, so a running server reloads it whole (within
10 seconds). Its existing lines must load for the trust domain of --spiffe-id.

The token is printed once, alone, on standard output: hand it to the machine
that will use it (trustbridge ca request --token-file, trustbridge agent
--token-file) and keep no other copy. Without --file, the whole line is printed
instead, for a token file you keep elsewhere (a Kubernetes Secret).

A token is single-use: the first certificate it buys consumes it, and that
certificate renews itself afterwards. --reusable makes a token that buys
certificates until it expires or its line is removed, as all tokens did before
single-use tokens: for labs only. Removing a line also stops the renewals of
the certificates its token bought.`,
		Example: `  umask 077
  trustbridge token create --spiffe-id spiffe://example.org/vm/laptop --ttl 1h \
      --file /etc/trustbridge/bootstrap-tokens > laptop.token
  trustbridge ca request --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --token-file laptop.token --credentials-dir ./creds

  # a lab token that never expires and is never consumed
  trustbridge token create --spiffe-id spiffe://example.org/lab/demo --ttl 0 --reusable --file tokens.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTokenCreate(e, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.spiffeID, "spiffe-id", "", "identity the token grants, e.g. spiffe://example.org/vm/laptop (required; it needs a path)")
	f.DurationVar(&o.ttl, "ttl", time.Hour, "how long the token may be used, from now, in whole seconds; 0 for no expiry")
	f.BoolVar(&o.reusable, "reusable", false, "the token is not consumed by the certificates it buys (labs only): it works until it expires or its line is removed")
	f.StringVar(&o.file, "file", "", "token file to append to: the server's --bootstrap-token-file (without it, the whole line is printed instead of the token)")
	return cmd
}

func runTokenCreate(e cli.Env, o tokenCreateOptions) error {
	line, err := o.line(e.Now())
	if err != nil {
		return err
	}
	if o.file == "" {
		fmt.Fprintln(e.Out, line.String())
		return nil
	}
	if err := authn.AppendBootstrapToken(o.file, line); err != nil {
		return fmt.Errorf("--file: %w", err)
	}
	fmt.Fprintln(e.Out, line.Token)
	fmt.Fprintf(e.Err, "added to %s: a %s token for %s, %s (reference %s)\n", o.file, use(line), line.ID, expiry(line), line.Ref())
	return nil
}

// line checks the flags and makes the token's line.
func (o tokenCreateOptions) line(now time.Time) (authn.TokenLine, error) {
	if o.spiffeID == "" {
		return authn.TokenLine{}, errors.New("--spiffe-id is required")
	}
	id, err := spiffeid.FromString(o.spiffeID)
	if err != nil {
		return authn.TokenLine{}, fmt.Errorf("--spiffe-id %q: %w", o.spiffeID, err)
	}
	if id.Path() == "" {
		return authn.TokenLine{}, fmt.Errorf("--spiffe-id %s has no path; a workload ID needs one, e.g. %s/vm/laptop", id, id)
	}
	if o.ttl < 0 || o.ttl%time.Second != 0 {
		return authn.TokenLine{}, fmt.Errorf("--ttl %s: want a whole number of seconds, 0 for no expiry", o.ttl)
	}
	token, err := authn.NewBootstrapToken()
	if err != nil {
		return authn.TokenLine{}, err
	}
	l := authn.TokenLine{Token: token, ID: id, Reusable: o.reusable}
	if o.ttl > 0 {
		l.Expires = now.Add(o.ttl).UTC().Truncate(time.Second)
	}
	return l, nil
}

// use and expiry describe the token on standard error.
func use(l authn.TokenLine) string {
	if l.Reusable {
		return "reusable"
	}
	return "single-use"
}

func expiry(l authn.TokenLine) string {
	if l.Expires.IsZero() {
		return "never expiring"
	}
	return "expiring " + l.Expires.Format(time.RFC3339)
}
