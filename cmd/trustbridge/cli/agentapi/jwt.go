package agentapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	jwtcmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/jwt"
)

type fetchJWTOptions struct {
	conn
	audience []string
	spiffeID string
	out      *cli.OutputFlag
}

func newFetchJWTCmd(e cli.Env, defaultSocket string) *cobra.Command {
	var o fetchJWTOptions
	cmd := &cobra.Command{
		Use:   "jwt --audience AUD [--audience AUD]... [--spiffe-id ID] [--socket-path PATH]",
		Short: "Fetch JWT-SVIDs for an audience and the JWT bundles (spire-agent api fetch jwt)",
		Long: `Ask the Workload API for this process's JWT-SVIDs for --audience (FetchJWTSVID;
--spiffe-id picks one of its identities when it has several), then the JWT
bundles it validates tokens with (FetchJWTBundles). The table shows each
token's SPIFFE ID, hint, audience and expiry, the token itself, then each
trust domain with its number of JWT authorities.`,
		Example: `  trustbridge agent api fetch jwt --audience https://api.example.com
  trustbridge agent api fetch jwt --audience a --audience b --spiffe-id spiffe://example.org/ns/default/sa/web -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFetchJWT(cmd.Context(), e, o)
		},
	}
	o.addFlags(cmd, defaultSocket)
	f := cmd.Flags()
	f.StringArrayVar(&o.audience, "audience", nil, "audience (aud) of the token; repeat for several (required)")
	f.StringVar(&o.spiffeID, "spiffe-id", "", "which of this process's identities to mint for (default: the agent's first)")
	o.out = cli.AddOutputFlag(cmd)
	return cmd
}

// JWTOutput is what fetch jwt prints.
type JWTOutput struct {
	SVIDs   []JWTSVIDOutput `json:"svids"`
	Bundles []BundleOutput  `json:"bundles"`
}

// JWTSVIDOutput is one JWT-SVID.
type JWTSVIDOutput struct {
	SPIFFEID  string    `json:"spiffe_id"`
	Hint      string    `json:"hint,omitempty"`
	Audience  []string  `json:"audience"`
	ExpiresAt time.Time `json:"expires_at"`
	Token     string    `json:"token"`
}

func runFetchJWT(ctx context.Context, e cli.Env, o fetchJWTOptions) error {
	params, err := o.params()
	if err != nil {
		return err
	}
	ctx, client, addr, done, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	svids, err := client.FetchJWTSVIDs(ctx, params)
	if err != nil {
		return callError(addr, "JWT-SVID", o.timeout, err)
	}
	bundles, err := client.FetchJWTBundles(ctx)
	if err != nil {
		return callError(addr, "JWT bundles", o.timeout, err)
	}
	out := JWTOutput{SVIDs: []JWTSVIDOutput{}, Bundles: jwtBundles(bundles)}
	for _, s := range svids {
		out.SVIDs = append(out.SVIDs, JWTSVIDOutput{SPIFFEID: s.ID.String(), Hint: s.Hint, Audience: s.Audience, ExpiresAt: s.Expiry.UTC(), Token: s.Marshal()})
	}
	return o.out.Write(e.Out, out, func(w io.Writer) error { return jwtTable(w, out) })
}

// params checks the flags into the request's parameters.
func (o fetchJWTOptions) params() (jwtsvid.Params, error) {
	var p jwtsvid.Params
	if err := o.out.Check(); err != nil {
		return p, err
	}
	if len(o.audience) == 0 || slices.Contains(o.audience, "") {
		return p, errors.New("--audience is required and must not be empty: name who the token is for")
	}
	p.Audience, p.ExtraAudiences = o.audience[0], o.audience[1:]
	if o.spiffeID != "" {
		id, err := spiffeid.FromString(o.spiffeID)
		if err != nil {
			return p, fmt.Errorf("--spiffe-id %q: %w", o.spiffeID, err)
		}
		p.Subject = id
	}
	return p, nil
}

// jwtBundles counts set's JWT authorities per trust domain, sorted.
func jwtBundles(set *jwtbundle.Set) []BundleOutput {
	return perTrustDomain(set.Bundles(), func(b *jwtbundle.Bundle) BundleOutput {
		n := len(b.JWTAuthorities())
		return BundleOutput{TrustDomain: b.TrustDomain().Name(), JWT: &n}
	})
}

func jwtTable(w io.Writer, out JWTOutput) error {
	for _, s := range out.SVIDs {
		fmt.Fprintf(w, "JWT-SVID %s\n  hint:       %s\n  audience:   %s\n  expires at: %s\n  token:\n%s\n\n",
			cli.Printable(s.SPIFFEID), orNone(s.Hint), cli.Printable(strings.Join(s.Audience, ", ")), stamp(s.ExpiresAt), cli.Printable(s.Token))
	}
	return bundlesTable(w, out.Bundles)
}

type validateJWTOptions struct {
	conn
	audience string
	out      *cli.OutputFlag
}

func newValidateJWTCmd(e cli.Env, defaultSocket string) *cobra.Command {
	var o validateJWTOptions
	cmd := &cobra.Command{
		Use:   "jwt [-|TOKEN] --audience AUD [--socket-path PATH]",
		Short: "Ask the Workload API whether a JWT-SVID is valid for an audience (spire-agent api validate jwt)",
		Long: `Ask the agent behind the Workload API to validate a JWT-SVID for --audience
(ValidateJWTSVID), against the JWT bundles it holds for this process: the
check a receiving workload makes. The token comes from standard input when
the argument is - or absent (preferred: an argument is readable by other
users in /proc/PID/cmdline and stays in shell history). Prints the SPIFFE ID,
audience, expiry and claims; exits non-zero, saying why, when the agent
refuses it.`,
		Example: `  printf '%s' "$TOKEN" | trustbridge agent api validate jwt --audience https://api.example.com -
  trustbridge agent api validate jwt --audience https://api.example.com -o json - < token.jwt`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runValidateJWT(cmd.Context(), e, o, args)
		},
	}
	o.addFlags(cmd, defaultSocket)
	cmd.Flags().StringVar(&o.audience, "audience", "", "audience the token must name (required)")
	o.out = cli.AddOutputFlag(cmd)
	return cmd
}

func runValidateJWT(ctx context.Context, e cli.Env, o validateJWTOptions, args []string) error {
	if err := o.out.Check(); err != nil {
		return err
	}
	if o.audience == "" {
		return errors.New("--audience is required: the audience this workload answers to")
	}
	token, err := jwtcmd.ReadTokenArg(e.In, args)
	if err != nil {
		return err
	}
	if len(args) == 1 && args[0] != "-" {
		fmt.Fprintln(e.Err, "warning: a token on the command line is readable by other users (/proc/PID/cmdline) and kept in shell history; pass - and give it on standard input")
	}
	ctx, client, addr, done, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	svid, err := client.ValidateJWTSVID(ctx, token, o.audience)
	if st, _ := status.FromError(err); st.Code() == codes.InvalidArgument {
		return fmt.Errorf("the agent at %s refuses the token for audience %s: %s", addr, cli.Printable(o.audience), cli.Printable(st.Message()))
	}
	if err != nil {
		return callError(addr, "validation", o.timeout, err)
	}
	out := jwtcmd.ValidateOutput{SPIFFEID: svid.ID.String(), Audience: svid.Audience, ExpiresAt: svid.Expiry.UTC(), Claims: svid.Claims}
	return o.out.Write(e.Out, out, func(w io.Writer) error { return validationTable(w, out) })
}

// validationTable prints v, every claim escaped: they are the token
// issuer's words, which may be another trust domain's.
func validationTable(w io.Writer, v jwtcmd.ValidateOutput) error {
	fmt.Fprintf(w, "valid JWT-SVID\n  spiffe id:  %s\n  audience:   %s\n  expires at: %s\n  claims:\n",
		cli.Printable(v.SPIFFEID), cli.Printable(strings.Join(v.Audience, ", ")), stamp(v.ExpiresAt))
	for _, k := range slices.Sorted(maps.Keys(v.Claims)) {
		if _, err := fmt.Fprintf(w, "    %s: %s\n", cli.Printable(k), cli.Printable(jwtcmd.ClaimText(v.Claims[k]))); err != nil {
			return err
		}
	}
	return nil
}
