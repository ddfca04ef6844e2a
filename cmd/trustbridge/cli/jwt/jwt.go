package jwt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/svid"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jwt",
		Short: "Mint and validate JWT-SVIDs",
		Long: `Mint a JWT-SVID from a running server's certificate service, for the identity
you authenticate as, or, as an operator on its admin API (--spiffe-id), for
any identity of its trust domain; or validate one against SPIFFE bundles.`,
		Example: `  trustbridge jwt mint --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --prov-cert /etc/creds --audience https://api.example.com
  trustbridge jwt mint --spiffe-id spiffe://example.org/ops/probe --audience https://api.example.com
  trustbridge jwt validate --bundle bundle.spiffe.json --audience https://api.example.com TOKEN`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newJWTMintCmd(e), newJWTValidateCmd(e))
	return cmd
}

type jwtMintOptions struct {
	cli.CAConn
	audience []string
	ttl      time.Duration
	out      *cli.OutputFlag
	admin    svid.JWTAdmin
}

func newJWTMintCmd(e cli.Env) *cobra.Command {
	var o jwtMintOptions
	cmd := &cobra.Command{
		Use:   "mint (--ca-addr ADDR --root-cert FILE (--token-file FILE | --prov-cert DIR) | --spiffe-id ID [--admin ADDR]) --audience AUD [--audience AUD]...",
		Short: "Obtain a JWT-SVID for your own identity, or as an operator for any identity, from a running server",
		Long: `Ask the certificate service of a running trustbridge (--grpc-listen) for a
JWT-SVID and print it. Its subject is the identity you authenticate as, exactly
as with 'trustbridge ca request': the X509-SVID in --prov-cert DIR (mTLS), or
the bearer token in --token-file (a reusable bootstrap token or a Kubernetes
service account token). The request cannot name another subject.

--audience is required (at most 16, each at most 512 bytes): who the token is
for; the receiver refuses a token not naming it. --ttl asks for a lifetime,
which the server clamps to its maximum; without it the server's default
(5 minutes) applies. -o table prints the token alone, for $(...); -o json or
yaml also print its SPIFFE ID and expiry.

With --spiffe-id ID the token is for ID, any identity of the server's trust
domain, minted as an operator on the server's admin API (spire-server jwt
mint): it needs the admin token (--data-dir or --admin-token-file), or the
admin socket found by default (or --admin unix://PATH), goes to the leader and is recorded in
the audit log (jwt_svid_minted) with who asked, the SPIFFE ID, audience, key
and expiry (never the token). --ca-addr, --root-cert, --token-file,
--prov-cert and --server-spiffe-id do not go with it.`,
		Example: `  # with the certificate trustbridge ca request or agent wrote
  trustbridge jwt mint --ca-addr trustbridge.example.org:15012 --root-cert /etc/creds/root-cert.pem \
      --prov-cert /etc/creds --audience https://api.example.com
  # with a Kubernetes service account token, two audiences, 10 minutes, as JSON
  trustbridge jwt mint --ca-addr trustbridge.trustbridge-system.svc:15012 --root-cert root-cert.pem \
      --token-file /var/run/secrets/tokens/trustbridge --audience a --audience b --ttl 10m -o json
  # call an API with it
  curl -H "Authorization: Bearer $(trustbridge jwt mint ... --audience https://api.example.com)" https://api.example.com
  # as an operator, for a probe's identity, on the admin socket
  trustbridge jwt mint --spiffe-id spiffe://example.org/ops/probe --audience https://api.example.com \
      --admin unix:///var/run/trustbridge/admin.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runJWTMint(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	cli.AddCAConnFlags(f, &o.CAConn)
	f.StringArrayVar(&o.audience, "audience", nil, "audience (aud) of the token; repeat for several (required)")
	f.DurationVar(&o.ttl, "ttl", 0, "lifetime to ask for, whole seconds (default: the server's, 5m; clamped to its maximum)")
	o.out = cli.AddOutputFlag(cmd)
	o.admin.AddFlags(cmd)
	for _, name := range []string{"ca-addr", "root-cert"} {
		fl := f.Lookup(name)
		fl.Usage = strings.Replace(fl.Usage, "(required)", "(required without --spiffe-id)", 1)
	}
	return cmd
}

// MintOutput is `jwt mint -o json|yaml`.
type MintOutput struct {
	SPIFFEID  string    `json:"spiffe_id"`
	ExpiresAt time.Time `json:"expires_at"`
	Token     string    `json:"token"`
}

func runJWTMint(ctx context.Context, e cli.Env, o jwtMintOptions) error {
	admin, err := o.admin.Enabled()
	if err != nil {
		return err
	}
	if admin {
		return runAdminJWTMint(ctx, e, o)
	}
	if err := o.check(); err != nil {
		return err
	}
	conn, _, err := o.Dial(e.Now())
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var p peer.Peer
	svid, err := caclient.MintJWTSVID(ctx, conn, o.audience, o.ttl, grpc.Peer(&p))
	if err != nil {
		return identityError(o.Addr, o.Timeout, "a JWT-SVID", err, p.Addr != nil)
	}
	out := MintOutput{SPIFFEID: svid.ID.String(), ExpiresAt: svid.ExpiresAt, Token: svid.Token}
	return o.out.Write(e.Out, out, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, svid.Token)
		return err
	})
}

// runAdminJWTMint is jwt mint --spiffe-id: as an operator, on the admin
// API.
func runAdminJWTMint(ctx context.Context, e cli.Env, o jwtMintOptions) error {
	if err := o.out.Check(); err != nil {
		return err
	}
	if err := checkAudiences(o.audience); err != nil {
		return err
	}
	var conflicting []string
	for name, v := range map[string]string{"--ca-addr": o.Addr, "--root-cert": o.RootCert, "--token-file": o.TokenFile, "--prov-cert": o.ProvCert, "--server-spiffe-id": o.ServerID} {
		if v != "" {
			conflicting = append(conflicting, name)
		}
	}
	slices.Sort(conflicting)
	res, err := o.admin.Mint(ctx, o.audience, o.ttl, o.Timeout, conflicting)
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(e.Err, "warning:", cli.Printable(w))
	}
	out := MintOutput{SPIFFEID: res.SPIFFEID, ExpiresAt: res.ExpiresAt.UTC(), Token: res.Token}
	return o.out.Write(e.Out, out, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, cli.Printable(res.Token))
		return err
	})
}

func (o jwtMintOptions) check() error {
	if err := o.out.Check(); err != nil {
		return err
	}
	if err := o.CheckAuth(); err != nil {
		return err
	}
	if err := checkAudiences(o.audience); err != nil {
		return err
	}
	if o.ttl < 0 || o.ttl%time.Second != 0 {
		return fmt.Errorf("--ttl %s: want a whole, positive number of seconds", o.ttl)
	}
	return nil
}

// checkAudiences refuses what the server would: none, or an empty one.
func checkAudiences(aud []string) error {
	if len(aud) == 0 {
		return errors.New("--audience is required: name who the token is for")
	}
	if slices.Contains(aud, "") {
		return errors.New("--audience must not be empty")
	}
	return nil
}

type jwtValidateOptions struct {
	cli.CAConn
	audience    []string
	bundle      string
	trustDomain string
	issuer      string
	issuerTD    string
	out         *cli.OutputFlag
}

func newJWTValidateCmd(e cli.Env) *cobra.Command {
	var o jwtValidateOptions
	cmd := &cobra.Command{
		Use:   "validate [-|TOKEN] --audience AUD (--bundle FILE [--trust-domain TD] | --ca-addr ADDR --root-cert FILE (--token-file FILE | --prov-cert DIR))",
		Short: "Validate a JWT-SVID against SPIFFE bundles",
		Long: `Validate a JWT-SVID (from standard input when the argument is - or absent,
the preferred form; or the argument, which other users can read in
/proc/PID/cmdline and which stays in shell history: a warning says so): its signature against the JWT authorities of its own trust domain only (the
trust domain of its subject), its expiry, and that its audience names one of
--audience. Prints the SPIFFE ID, audience, expiry and every claim; exits
non-zero, saying why, when the token is not valid.

The bundles come from --bundle FILE, a SPIFFE bundle map (bundle.spiffe.json,
as 'ca request' writes it) or, with --trust-domain, one trust domain's SPIFFE
bundle; or, without --bundle, from the running server (WatchBundles on the
certificate service's listener), authenticated as for 'jwt mint': the bundles
of every trust domain the server's trust policy lets you trust.

--issuer URL also requires, as a cloud relying party that trusts only that
issuer's keys does, the token's iss claim to be exactly URL and the token to be
of the issuer's trust domain (--issuer-trust-domain; by default the server's
own trust domain, or --trust-domain with a single bundle): a federated peer's
key must not pass for the issuer's. Without --issuer, a token of the server's
own trust domain validated against the server's bundles is refused when its
iss names another issuer than the server's --jwt-issuer.`,
		Example: `  # against a bundle map, the token on standard input (-)
  printf '%s' "$TOKEN" | trustbridge jwt validate --bundle /etc/creds/bundle.spiffe.json --audience https://api.example.com -
  # against one peer's bundle, token from a file, as JSON
  trustbridge jwt validate --bundle partner.json --trust-domain partner.example --audience me -o json - < token.jwt
  # against what the server lets this workload trust
  printf '%s' "$TOKEN" | trustbridge jwt validate --ca-addr trustbridge.example.org:15012 --root-cert /etc/creds/root-cert.pem \
      --prov-cert /etc/creds --audience https://api.example.com -
  # as AWS would: issued by our OIDC issuer, for sts.amazonaws.com
  printf '%s' "$TOKEN" | trustbridge jwt validate --bundle /etc/creds/bundle.spiffe.json \
      --issuer https://oidc.example.com --issuer-trust-domain prod.example --audience sts.amazonaws.com -`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJWTValidate(cmd.Context(), e, o, args)
		},
	}
	f := cmd.Flags()
	cli.AddCAConnFlags(f, &o.CAConn)
	for _, name := range []string{"ca-addr", "root-cert"} {
		fl := f.Lookup(name)
		fl.Usage = strings.Replace(fl.Usage, "(required)", "(required without --bundle)", 1)
	}
	f.StringArrayVar(&o.audience, "audience", nil, "audience the token must name (one of them, when repeated) (required)")
	f.StringVar(&o.bundle, "bundle", "", "SPIFFE bundle map, or a single bundle with --trust-domain, to validate against (default: fetch from the server)")
	f.StringVar(&o.trustDomain, "trust-domain", "", "trust domain of the single bundle in --bundle")
	f.StringVar(&o.issuer, "issuer", "", "iss the token must carry exactly (an OIDC issuer URL, the server's --jwt-issuer); a token with another or none, or of another trust domain than the issuer's, is refused")
	f.StringVar(&o.issuerTD, "issuer-trust-domain", "", "trust domain whose JWT-SVIDs --issuer signs (default: the server's own, or --trust-domain; required with a --bundle map)")
	o.out = cli.AddOutputFlag(cmd)
	return cmd
}

// ValidateOutput is what `jwt validate` prints.
type ValidateOutput struct {
	SPIFFEID  string         `json:"spiffe_id"`
	Audience  []string       `json:"audience"`
	ExpiresAt time.Time      `json:"expires_at"`
	Claims    map[string]any `json:"claims"`
}

func runJWTValidate(ctx context.Context, e cli.Env, o jwtValidateOptions, args []string) error {
	if err := o.out.Check(); err != nil {
		return err
	}
	if err := checkAudiences(o.audience); err != nil {
		return err
	}
	if err := o.checkIssuerFlags(); err != nil {
		return err
	}
	token, err := ReadTokenArg(e.In, args)
	if err != nil {
		return err
	}
	if len(args) == 1 && args[0] != "-" {
		fmt.Fprintln(e.Err, "warning: a token on the command line is readable by other users (/proc/PID/cmdline) and kept in shell history; pass - and give it on standard input")
	}
	trust, err := o.bundles(ctx, e.Now())
	if err != nil {
		return err
	}
	svid, err := jwtsvid.Validate(token, trust.source, o.audience, trust.issuerOf)
	if err == nil {
		err = o.checkIssuer(svid, trust.local)
	}
	if err != nil {
		if td := unverifiedTrustDomain(token); slices.Contains(trust.withheld, td) {
			return fmt.Errorf("the token is of trust domain %s, which the server's trust policy grants you only for some peers: a bundle cannot carry that limit, so the server does not hand its bundle out; validate with --bundle holding it, or ask for a grant without peers", td)
		}
		return fmt.Errorf("the token is not a valid JWT-SVID for audience %s: %w", strings.Join(o.audience, ", "), err)
	}
	out := ValidateOutput{SPIFFEID: svid.ID.String(), Audience: svid.Audience, ExpiresAt: svid.Expiry.UTC(), Claims: svid.Claims}
	return o.out.Write(e.Out, out, func(w io.Writer) error { return printJWTValidation(w, out) })
}

// ReadTokenArg is the token argument, or standard input for - or none.
func ReadTokenArg(in io.Reader, args []string) (string, error) {
	if len(args) == 1 && args[0] != "-" {
		return args[0], nil
	}
	data, err := io.ReadAll(io.LimitReader(in, jwtsvid.MaxTokenBytes+2))
	if err != nil {
		return "", fmt.Errorf("read the token from standard input: %w", err)
	}
	token := strings.TrimSpace(string(data))
	switch {
	case token == "":
		return "", errors.New("no token: pass it as the argument or on standard input")
	case len(token) > jwtsvid.MaxTokenBytes:
		return "", fmt.Errorf("the token on standard input is over %d bytes; a JWT-SVID is a few hundred", jwtsvid.MaxTokenBytes)
	}
	return token, nil
}

// unverifiedTrustDomain is the trust domain of the token's subject, read
// without verifying anything, to explain a failure; "" when there is none.
func unverifiedTrustDomain(token string) string {
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.ES512, jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512})
	if err != nil {
		return ""
	}
	var c jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&c); err != nil {
		return ""
	}
	id, err := spiffeid.FromString(c.Subject)
	if err != nil {
		return ""
	}
	return id.TrustDomain().Name()
}

// checkIssuerFlags refuses --issuer and --issuer-trust-domain that
// could not check anything: a malformed issuer, or a bundle map with no
// trust domain to hold the issuer to.
func (o jwtValidateOptions) checkIssuerFlags() error {
	switch {
	case o.issuer == "" && o.issuerTD != "":
		return errors.New("--issuer-trust-domain names --issuer's trust domain; give --issuer too")
	case o.issuer == "":
		return nil
	}
	if _, err := jwtsvid.ParseIssuer(o.issuer); err != nil {
		return fmt.Errorf("--issuer: %w", err)
	}
	if o.issuerTD != "" {
		if _, err := bundledoc.ParseTrustDomain(o.issuerTD); err != nil {
			return fmt.Errorf("--issuer-trust-domain %q: %w", o.issuerTD, err)
		}
	} else if o.bundle != "" && o.trustDomain == "" {
		return errors.New("--issuer with a --bundle map needs --issuer-trust-domain TD, the trust domain whose tokens the issuer signs: any trust domain's key in the map would otherwise pass for the issuer's")
	}
	return nil
}

// checkIssuer holds a valid svid to --issuer: its iss exactly, and its
// trust domain the issuer's (--issuer-trust-domain, else --trust-domain,
// else local, the server's).
func (o jwtValidateOptions) checkIssuer(svid *spiffejwt.SVID, local spiffeid.TrustDomain) error {
	if o.issuer == "" {
		return nil
	}
	iss, present := svid.Claims["iss"]
	switch {
	case !present:
		return fmt.Errorf("it carries no iss, and --issuer %q asks for one; its server mints with iss once started with --jwt-issuer", o.issuer)
	case iss != o.issuer:
		return fmt.Errorf("its iss %q is not --issuer %q", fmt.Sprint(iss), o.issuer)
	}
	want := local.Name()
	for _, name := range []string{o.trustDomain, o.issuerTD} {
		// Checked before (checkIssuerFlags, fileBundles); parsed again
		// for the name, as spiffe://td is accepted too.
		if td, err := bundledoc.ParseTrustDomain(name); err == nil {
			want = td.Name()
		}
	}
	if got := svid.ID.TrustDomain().Name(); got != want {
		return fmt.Errorf("it is of trust domain %s, not %s, whose tokens --issuer %q signs: another trust domain's key must not pass for the issuer's", got, want, o.issuer)
	}
	return nil
}

// validationTrust is what a token is validated with: the JWT
// authorities, the trust domains the server withheld, the issuer it
// names for its own trust domain's JWT-SVIDs, and that trust domain
// (zero with --bundle).
type validationTrust struct {
	source   jwtbundle.Source
	withheld []string
	issuerOf jwtsvid.IssuerOf
	local    spiffeid.TrustDomain
}

// bundles is the trust to validate with: --bundle, or the server's.
func (o jwtValidateOptions) bundles(ctx context.Context, now time.Time) (*validationTrust, error) {
	if o.bundle == "" {
		return o.serverBundles(ctx, now)
	}
	source, err := o.fileBundles()
	return &validationTrust{source: source}, err
}

func (o jwtValidateOptions) fileBundles() (jwtbundle.Source, error) {
	if o.Addr != "" || o.TokenFile != "" || o.ProvCert != "" {
		return nil, errors.New("--bundle is the trust to validate with; --ca-addr, --token-file and --prov-cert fetch it from the server instead: give one or the other")
	}
	var td spiffeid.TrustDomain
	if o.trustDomain != "" {
		var err error
		if td, err = bundledoc.ParseTrustDomain(o.trustDomain); err != nil {
			return nil, fmt.Errorf("--trust-domain %q: %w", o.trustDomain, err)
		}
	}
	doc, err := cli.ReadSmallFile(o.bundle, bundledoc.DefaultMaxSize)
	if err != nil {
		return nil, fmt.Errorf("--bundle: %w", err)
	}
	bundles, err := caclient.ParseBundles(doc, td)
	if err != nil {
		return nil, fmt.Errorf("--bundle %s: %w", o.bundle, err)
	}
	return caclient.JWTSource(bundles), nil
}

func (o jwtValidateOptions) serverBundles(ctx context.Context, now time.Time) (*validationTrust, error) {
	if o.trustDomain != "" {
		return nil, errors.New("--trust-domain names the trust domain of --bundle; the server's bundles name their own")
	}
	if err := o.CheckAuth(); err != nil {
		return nil, fmt.Errorf("without --bundle, the bundles come from the server: %w", err)
	}
	conn, local, err := o.Dial(now)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	b, err := caclient.FetchBundles(ctx, conn, local)
	if err != nil {
		return nil, identityError(o.Addr, o.Timeout, "bundles", err, false)
	}
	issuerOf := func(td spiffeid.TrustDomain) string {
		if td == local {
			return b.JWTIssuer
		}
		return ""
	}
	return &validationTrust{source: caclient.JWTSource(b.Bundles), withheld: b.Withheld, issuerOf: issuerOf, local: local}, nil
}

// identityError is requestError for the identity service's calls:
// Unimplemented means a server older than the service, and Unavailable
// from a server that answered (answered: the call reached it) is its own
// word, such as a CA that cannot sign now, not a connection problem.
func identityError(addr string, timeout time.Duration, what string, err error, answered bool) error {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unimplemented:
		return fmt.Errorf("the server at %s does not serve %s: it predates trustbridge's identity service (trustbridge.identity.v1) and must be upgraded: %s", addr, what, st.Message())
	case codes.Unavailable:
		if answered {
			return fmt.Errorf("the CA at %s cannot give %s right now; retry later: %s", addr, what, st.Message())
		}
	}
	return cli.RequestError(addr, timeout, what, err)
}

func printJWTValidation(w io.Writer, v ValidateOutput) error {
	fmt.Fprintf(w, "valid JWT-SVID\n  spiffe id:  %s\n  audience:   %s\n  expires at: %s\n  claims:\n", v.SPIFFEID, strings.Join(v.Audience, ", "), v.ExpiresAt.Format(time.RFC3339))
	for _, k := range slices.Sorted(maps.Keys(v.Claims)) {
		if _, err := fmt.Fprintf(w, "    %s: %s\n", k, ClaimText(v.Claims[k])); err != nil {
			return err
		}
	}
	return nil
}

// ClaimText shows a claim as it reads in the token: JSON numbers decode as
// float64, which %v would print as 1.795574191e+09 for an exp.
func ClaimText(v any) string {
	if f, ok := v.(float64); ok {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}
