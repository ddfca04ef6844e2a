package svid

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Files x509 mint --write writes, as spire-server x509 mint names them.
const (
	chainFile  = "svid.pem"
	keyFile    = "key.pem"
	bundleFile = "bundle.pem"
)

// NewX509Cmd is trustbridge x509: mint.
func NewX509Cmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "x509",
		Short: "Mint X509-SVIDs as an operator, on the running server's admin API",
		Example: `  trustbridge x509 mint --spiffe-id spiffe://example.org/ops/probe --write ./probe
  trustbridge x509 mint --spiffe-id spiffe://example.org/ops/probe --dns probe.example.org --ttl 1h -o json`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newX509MintCmd(e))
	return cmd
}

type x509MintOptions struct {
	admin    cli.AdminClient
	spiffeID string
	dns      []string
	ttl      time.Duration
	keyType  string
	write    string
	timeout  time.Duration
	out      *cli.OutputFlag
}

func newX509MintCmd(e cli.Env) *cobra.Command {
	var o x509MintOptions
	cmd := &cobra.Command{
		Use:   "mint --spiffe-id ID [--dns NAME]... [--ttl DURATION] [--write DIR]",
		Short: "Mint an X509-SVID for any identity of the trust domain (spire-server x509 mint)",
		Long: `Ask the running server's admin API for an X509-SVID of --spiffe-id, an
identity of the server's own trust domain: for a probe, a test client, a
one-off job, a workload that cannot run an agent. The key is generated here
(--key-type) and never leaves this machine: the server gets a CSR, signs its
key for --spiffe-id with the active authority, and answers the chain and the
trust domain's roots. The answer is verified here (go-spiffe's x509svid)
before anything is printed or written.

--ttl asks for a lifetime, which the server clamps to its --max-workload-ttl
(a warning says so); without it the server's --workload-ttl applies. --dns
adds DNS names (repeat it).

Minting is a mutation: it needs the admin token (--data-dir or
--admin-token-file), or the admin socket found by default (or --admin
unix://PATH), goes to the leader, and is recorded in the audit log (x509_svid_minted) with who asked,
the SPIFFE ID, serial and expiry. Whoever holds the admin token can mint any
identity of the trust domain: guard it as the CA's keys.

Without --write the chain, the key and the roots are printed as PEM (-o json
or yaml: as fields); with --write DIR they go to DIR/svid.pem, DIR/key.pem
(mode 0600) and DIR/bundle.pem, and only their names are printed.`,
		Example: `  # files for curl --cert/--key/--cacert, or any TLS client
  trustbridge x509 mint --spiffe-id spiffe://example.org/ops/probe --write ./probe
  # with a DNS name, an hour, over the admin socket (no token needed)
  trustbridge x509 mint --spiffe-id spiffe://example.org/web --dns web.example.org --ttl 1h \
      --admin unix:///var/run/trustbridge/admin.sock --write ./web
  # as JSON, key included, for a script
  trustbridge x509 mint --spiffe-id spiffe://example.org/ci/job --ttl 10m -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runX509Mint(cmd.Context(), e, cli.AdminFrom(cmd, &o.admin), o)
		},
	}
	f := cmd.Flags()
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	o.admin.AddAuthFlags(f)
	f.StringVar(&o.spiffeID, "spiffe-id", "", "SPIFFE ID of the X509-SVID, in the server's trust domain, with a path (required)")
	f.StringArrayVar(&o.dns, "dns", nil, "DNS name to add to the certificate; repeat for several")
	f.DurationVar(&o.ttl, "ttl", 0, "lifetime to ask for, whole seconds (default: the server's --workload-ttl; clamped to its --max-workload-ttl)")
	f.StringVar(&o.keyType, "key-type", string(ca.KeyECP256), "key type: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	f.StringVar(&o.write, "write", "", "directory to write "+chainFile+", "+keyFile+" (0600) and "+bundleFile+" into, instead of printing them")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "deadline for the request")
	o.out = cli.AddOutputFlag(cmd)
	return cmd
}

// X509Output is what x509 mint prints with -o json|yaml.
type X509Output struct {
	SPIFFEID  string    `json:"spiffe_id"`
	Serial    string    `json:"serial"`
	ExpiresAt time.Time `json:"expires_at"`
	// CertChain is the leaf and its intermediates, PEM.
	CertChain string `json:"cert_chain"`
	// PrivateKey is the key, PKCS#8 PEM; only without --write.
	PrivateKey string `json:"private_key,omitempty"`
	// Bundle is the trust domain's roots, PEM.
	Bundle string `json:"bundle"`
	// Files are what --write wrote.
	Files    []string `json:"files,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

func runX509Mint(ctx context.Context, e cli.Env, c *cli.AdminClient, o x509MintOptions) error {
	id, kt, err := o.check()
	if err != nil {
		return err
	}
	key, err := ca.GenerateKey(kt)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return fmt.Errorf("create the CSR: %w", err)
	}
	req := api.X509SVIDMint{SPIFFEID: id.String(), CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
		DNSNames: o.dns, TTLSeconds: int64(o.ttl / time.Second)}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var res api.X509SVIDMinted
	if err := post(ctx, c, "/v1/svid/x509", "x509 mint", req, &res); err != nil {
		return err
	}
	out, err := checkMinted(id, key, res)
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(e.Err, "warning:", cli.Printable(w))
	}
	if o.write != "" {
		return writeMinted(e, o, id, key, out)
	}
	keyPEM, err := cli.KeyPEM(key)
	if err != nil {
		return err
	}
	out.PrivateKey = string(keyPEM)
	return o.out.Write(e.Out, out, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "X509-SVID %s (serial %s), valid until %s:\n%s\nPrivate key:\n%s\nRoot CAs:\n%s",
			out.SPIFFEID, out.Serial, out.ExpiresAt.Format(time.RFC3339), out.CertChain, out.PrivateKey, out.Bundle)
		return err
	})
}

// check checks the flags and returns the identity and key type.
func (o x509MintOptions) check() (spiffeid.ID, ca.KeyType, error) {
	if err := o.out.Check(); err != nil {
		return spiffeid.ID{}, "", err
	}
	if o.spiffeID == "" {
		return spiffeid.ID{}, "", errors.New("--spiffe-id is required: the identity to mint, e.g. spiffe://example.org/ops/probe")
	}
	id, err := spiffeid.FromString(o.spiffeID)
	if err != nil {
		return spiffeid.ID{}, "", fmt.Errorf("--spiffe-id %q: %w", o.spiffeID, err)
	}
	if err := checkTTL(o.ttl); err != nil {
		return spiffeid.ID{}, "", err
	}
	if o.timeout <= 0 {
		return spiffeid.ID{}, "", fmt.Errorf("--timeout %s must be positive", o.timeout)
	}
	kt, err := ca.ParseKeyType(o.keyType)
	if err != nil {
		return spiffeid.ID{}, "", fmt.Errorf("--key-type: %w", err)
	}
	return id, kt, nil
}

func checkTTL(ttl time.Duration) error {
	if ttl < 0 || ttl%time.Second != 0 {
		return fmt.Errorf("--ttl %s: want a whole, positive number of seconds", ttl)
	}
	return nil
}

// checkMinted verifies the server's answer before anyone uses it: the
// chain verifies against the roots answered, for id, and certifies key.
func checkMinted(id spiffeid.ID, key crypto.Signer, res api.X509SVIDMinted) (X509Output, error) {
	out := X509Output{SPIFFEID: id.String(), Serial: cli.Printable(res.Serial), ExpiresAt: res.ExpiresAt.UTC(), CertChain: res.CertChain, Bundle: res.Bundle, Warnings: res.Warnings}
	chain, err := cli.ParsePEMCerts([]byte(res.CertChain))
	if err != nil {
		return out, fmt.Errorf("the server's chain: %w", err)
	}
	roots, err := cli.ParsePEMCerts([]byte(res.Bundle))
	if err != nil {
		return out, fmt.Errorf("the server's bundle: %w", err)
	}
	got, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(id.TrustDomain(), roots))
	switch {
	case err != nil:
		return out, fmt.Errorf("the server's answer does not verify against the roots it sent: %w", err)
	case got != id:
		return out, fmt.Errorf("the server signed %s, not %s", got, id)
	case !publicKeysEqual(chain[0].PublicKey, key.Public()):
		return out, errors.New("the server's certificate is not for the key this command generated")
	}
	return out, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

// writeMinted writes the chain, key and roots into --write and prints
// their names.
func writeMinted(e cli.Env, o x509MintOptions, id spiffeid.ID, key crypto.Signer, out X509Output) error {
	keyPEM, err := cli.KeyPEM(key)
	if err != nil {
		return err
	}
	files := []cli.OutFile{
		{Name: chainFile, Data: []byte(out.CertChain), Mode: 0o644},
		{Name: keyFile, Data: keyPEM, Mode: 0o600},
		{Name: bundleFile, Data: []byte(out.Bundle), Mode: 0o644},
	}
	if err := cli.WriteFiles(o.write, files); err != nil {
		return fmt.Errorf("--write: %w", err)
	}
	for _, f := range files {
		out.Files = append(out.Files, filepath.Join(o.write, f.Name))
	}
	return o.out.Write(e.Out, out, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "minted X509-SVID %s (serial %s), valid until %s\n  %s\n  %s (mode 0600)\n  %s (the roots of %s)\n",
			out.SPIFFEID, out.Serial, out.ExpiresAt.Format(time.RFC3339), out.Files[0], out.Files[1], out.Files[2], id.TrustDomain().Name())
		return err
	})
}

// post sends req to the admin API's path as a mutation and reads the
// answer into res; a server without the route is named as too old.
func post(ctx context.Context, c *cli.AdminClient, path, what string, req, res any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	answer, err := c.Do(ctx, http.MethodPost, path, body, true)
	var ae *cli.AdminError
	if errors.As(err, &ae) && ae.Code == http.StatusNotFound && ae.Message == "404 page not found" {
		return fmt.Errorf("the server at %s does not serve %s: it predates %s and must be upgraded", c.Addr, path, what)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(answer), res); err != nil {
		return fmt.Errorf("admin answer to %s: %w", path, err)
	}
	return nil
}
