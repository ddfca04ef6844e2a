package token

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn"
)

// States of a listed token.
const (
	stateUsable   = "usable"
	stateExpired  = "expired"
	stateConsumed = "consumed"
	// stateUnknown: single-use and unexpired, with no ledger to say
	// whether it was spent.
	stateUnknown = "unknown"
)

// listedToken is one token of token list: never the token itself.
type listedToken struct {
	Reference  string     `json:"reference"`
	SPIFFEID   string     `json:"spiffe_id"`
	Line       int        `json:"line"`
	Use        string     `json:"use"`
	Expires    *time.Time `json:"expires,omitempty"`
	State      string     `json:"state"`
	ConsumedAt *time.Time `json:"consumed_at,omitempty"`
}

func newTokenListCmd(e cli.Env) *cobra.Command {
	var file, dataDir string
	var output *cli.OutputFlag
	cmd := &cobra.Command{
		Use:   "list --file FILE [--data-dir DIR]",
		Short: "List the tokens of a token file by reference, with their identity, expiry and state; never the tokens",
		Long: `List the tokens of --file, the server's --bootstrap-token-file: for each, its
reference (the fingerprint its certificates, the server's logs and
trustbridge token revoke name it by: a slow digest, never the token), the
identity it grants, whether it is single-use or reusable, its expiry, and
its state: usable, expired, or consumed (a single-use token spent on a
certificate, and when). The file records no creation time.

Consumption is read from the ledger in --data-dir (` + authn.LedgerFileName + `),
so run this as the server's user with its --data-dir; without that directory
a single-use token's state is "unknown". With --storage kube the ledger is
the --bootstrap-token-secret Secret, not read here.`,
		Example: `  trustbridge token list --file /etc/trustbridge/bootstrap-tokens --data-dir /var/lib/trustbridge/data
  trustbridge token list --file tokens.csv -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := output.Check(); err != nil {
				return err
			}
			if file == "" {
				return errors.New("--file is required: the server's --bootstrap-token-file")
			}
			list, err := listTokens(cmd.Context(), e, file, dataDir)
			if err != nil {
				return err
			}
			return output.Print(e.Out, list, tokensTable(list))
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "file", "", "token file: the server's --bootstrap-token-file (required)")
	f.StringVar(&dataDir, "data-dir", "./data", "the server's --data-dir, whose "+authn.LedgerFileName+" records consumed single-use tokens")
	output = cli.AddOutputFlag(cmd)
	return cmd
}

// listTokens describes file's tokens, their consumption as the ledger in
// dataDir records it when there is one.
func listTokens(ctx context.Context, e cli.Env, file, dataDir string) ([]listedToken, error) {
	infos, err := authn.ListBootstrapTokens(file)
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	ledger, why := openLedger(dataDir)
	if why != "" {
		fmt.Fprintf(e.Err, "consumption unknown: %s\n", why)
	}
	now := e.Now()
	out := make([]listedToken, 0, len(infos))
	for _, in := range infos {
		t := listedToken{Reference: in.Ref, SPIFFEID: in.ID.String(), Line: in.Line, Use: "single-use", State: stateUsable}
		if in.Reusable {
			t.Use = "reusable"
		}
		if !in.Expires.IsZero() {
			exp := in.Expires
			t.Expires = &exp
		}
		switch {
		case t.Expires != nil && !now.Before(*t.Expires):
			t.State = stateExpired
		case in.Reusable:
		case ledger == nil:
			t.State = stateUnknown
		default:
			c, consumed, err := ledger.Consumed(ctx, in.Ref)
			if err != nil {
				return nil, fmt.Errorf("--data-dir: %w", err)
			}
			if consumed {
				at := c.At
				t.State, t.ConsumedAt = stateConsumed, &at
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// openLedger opens the consumed-token ledger of dataDir, or says why not.
func openLedger(dataDir string) (authn.TokenLedger, string) {
	if fi, err := os.Stat(dataDir); err != nil || !fi.IsDir() {
		return nil, fmt.Sprintf("--data-dir %s is not a directory here; run this with the server's --data-dir to see which single-use tokens were consumed", dataDir)
	}
	l, err := authn.OpenFileLedger(filepath.Join(dataDir, authn.LedgerFileName))
	if err != nil {
		return nil, fmt.Sprintf("--data-dir: %v", err)
	}
	return l, ""
}

// tokensTable is token list for people; -o name prints the references,
// which token revoke takes.
func tokensTable(list []listedToken) cli.Table {
	t := cli.Table{
		Columns: []cli.Column{{Name: "Reference"}, {Name: "SPIFFE ID"}, {Name: "Use"}, {Name: "Expires"}, {Name: "State"}},
		Empty:   "no tokens in the file",
	}
	for _, tok := range list {
		exp := "never"
		if tok.Expires != nil {
			exp = tok.Expires.UTC().Format(time.RFC3339)
		}
		state := tok.State
		if tok.ConsumedAt != nil {
			state += " " + tok.ConsumedAt.UTC().Format(time.RFC3339)
		}
		t.Rows = append(t.Rows, cli.Row{Name: tok.Reference, Cells: []any{tok.Reference, cli.Printable(tok.SPIFFEID), tok.Use, exp, state}})
	}
	return t
}

// reloadTokens asks the running server to reload its token file after
// ref's removal. A server that cannot be reached reloads the file at its
// next poll: a warning. One that answers it could not load the file keeps
// the tokens it had, the revoked one among them: an error.
func reloadTokens(cmd *cobra.Command, e cli.Env, c *cli.AdminClient, ref string) error {
	_, err := c.Do(cmd.Context(), http.MethodPost, "/v1/bootstrap-tokens/reload", nil, true)
	var ae *cli.AdminError
	switch {
	case err == nil:
		fmt.Fprintln(e.Out, "the server reloaded the token file: the token no longer authenticates")
		return nil
	case errors.As(err, &ae) && ae.Code == http.StatusNotFound:
		fmt.Fprintf(e.Err, "warning: the server at %s has no bootstrap token file loaded (no --bootstrap-token-file), so there was nothing to reload; check that --file is the token file of the server that takes the token\n", c.Addr)
		return nil
	case errors.As(err, &ae) && ae.Code != http.StatusUnauthorized && ae.Code != http.StatusForbidden:
		return fmt.Errorf("the server could not reload the token file: %s; token %s is STILL accepted until the file is readable by the server, valid, and reloaded (it retries every 10 seconds, and at SIGHUP)", ae.Message, ref)
	}
	fmt.Fprintf(e.Err, "warning: the server was not told to reload the file (%v); a running server reloads it within 10 seconds, or at SIGHUP\n", err)
	return nil
}

func newTokenRevokeCmd(e cli.Env) *cobra.Command {
	var (
		file string
		c    cli.AdminClient
	)
	cmd := &cobra.Command{
		Use:   "revoke REFERENCE --file FILE",
		Short: "Remove a token from the token file and have the running server reload it at once",
		Long: `Remove the token whose reference is REFERENCE (or starts with it: at least 8
hex digits, naming one token; trustbridge token list shows them) from --file,
the server's --bootstrap-token-file. The file is read once and replaced
atomically, keeping its owner, group, mode (never widened), comments and
other lines. Then the running server is asked to reload the file now, over
its admin socket in --data-dir, or at --admin with the admin token, so the
token stops working at once. When the server cannot be reached, the reason
is printed and it still reloads the file within 10 seconds (or at SIGHUP);
when it answers that the file does not load, the token is still accepted and
the command fails saying why.

Certificates the token bought stop renewing themselves: their grant names a
token the file no longer holds. Those already issued stay valid until they
expire; revoke the CA authority that signed them (trustbridge ca authority)
to end them sooner.`,
		Example: `  trustbridge token revoke 3f2a9c01 --file /etc/trustbridge/bootstrap-tokens --data-dir /var/lib/trustbridge/data
  trustbridge token list --file tokens.csv`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return errors.New("--file is required: the server's --bootstrap-token-file")
			}
			gone, err := authn.RemoveBootstrapToken(file, args[0])
			if err != nil {
				return fmt.Errorf("--file: %w", err)
			}
			fmt.Fprintf(e.Out, "revoked %s (%s, line %d of %s)\n", gone.Ref, gone.ID, gone.Line, file)
			return reloadTokens(cmd, e, cli.AdminFrom(cmd, &c), gone.Ref)
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "file", "", "token file: the server's --bootstrap-token-file (required)")
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	c.AddAuthFlags(f)
	return cmd
}
