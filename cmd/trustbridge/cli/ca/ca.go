package ca

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/datadir"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Operate the embedded CA's state directory",
		Example: `  trustbridge ca rotate --data-dir ./data
  trustbridge ca issue --data-dir ./data --spiffe-id spiffe://example.org/demo --credentials-dir ./demo-creds`,
	}
	cmd.AddCommand(newCAIssueCmd(e), newCARotateCmd(e), newCARequestCmd(e), newCARaiseSequenceCmd(e), newAuthorityCmd(e), newDrillCmd(e))
	return cmd
}

type caIssueOptions struct {
	dataDir  string
	caDir    string
	td       string
	spiffeID string
	credsDir string
	ttl      time.Duration
	keyType  string
}

func newCAIssueCmd(e cli.Env) *cobra.Command {
	var (
		o   caIssueOptions
		out *cli.OldName
	)
	cmd := &cobra.Command{
		Use:   "issue --data-dir DIR --spiffe-id ID --credentials-dir DIR",
		Short: "Issue a workload certificate from the CA state (bootstrap, examples)",
		Long: `Generate a key locally and issue an X509-SVID for --spiffe-id from the active
root in --data-dir, writing key.pem (mode 0600), cert-chain.pem (leaf first)
and root-cert.pem (every published root of this trust domain, and nothing
else) into --credentials-dir, the directory a workload (or trustbridge agent
--credentials-dir) reads them from.

This is for operators: whoever can read --data-dir holds the CA and may
issue any identity of the trust domain. It takes a shared lock on the CA
state (not the server's lock on the data directory), so it is safe to run
while a server uses it, and the server cannot retire the root it signs with
meanwhile.`,
		Example: `  trustbridge ca issue --data-dir ./data --spiffe-id spiffe://example.org/demo --credentials-dir ./demo-creds
  trustbridge ca issue --ca-dir /etc/cacerts --spiffe-id spiffe://example.org/vm/db --credentials-dir ./db-creds --ttl 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.Merge(&o.credsDir, ""); err != nil {
				return err
			}
			return runCAIssue(e, o)
		},
	}
	out = cli.AddOldName(cmd, "out", cli.CredentialsDirFlag)
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "./data", "the server's --data-dir (file storage only; with --storage kube use ca request)")
	f.StringVar(&o.caDir, "ca-dir", "", "sign with a plug-in CA directory (Istio cacerts layout) instead of --data-dir")
	f.StringVar(&o.td, "trust-domain", "", "trust domain of the --ca-dir CA (default: that of --spiffe-id)")
	f.StringVar(&o.spiffeID, "spiffe-id", "", "SPIFFE ID to issue, e.g. spiffe://example.org/ns/default/sa/web (required)")
	f.StringVar(&o.credsDir, cli.CredentialsDirFlag, "", "directory to write key.pem (0600), cert-chain.pem and root-cert.pem into (required)")
	f.DurationVar(&o.ttl, "ttl", ca.DefaultConfig().WorkloadTTL, "certificate lifetime; at most the server's --max-workload-ttl")
	f.StringVar(&o.keyType, "key-type", string(ca.KeyECP256), "workload key type: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	return cmd
}

func runCAIssue(e cli.Env, o caIssueOptions) error {
	if o.spiffeID == "" || o.credsDir == "" {
		return errors.New("--spiffe-id and --credentials-dir are required")
	}
	id, err := spiffeid.FromString(o.spiffeID)
	if err != nil {
		return fmt.Errorf("--spiffe-id %q: %w", o.spiffeID, err)
	}
	kt, err := ca.ParseKeyType(o.keyType)
	if err != nil {
		return fmt.Errorf("--key-type: %w", err)
	}
	// The key first: RSA keys take a while, and the state lock is held
	// from reading the roots until the certificate is signed.
	key, err := ca.GenerateKey(kt)
	if err != nil {
		return err
	}
	td, m, maxTTL, unlock, err := issuingMaterial(e, o, id)
	if err != nil {
		return err
	}
	defer unlock()
	// The key goes through the same signer as any workload's.
	issued, err := ca.SignX509SVID(e.Now(), m, ca.Policy{TrustDomain: td, DefaultTTL: o.ttl, MaxTTL: maxTTL}, ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: id, TTL: o.ttl})
	if err != nil {
		return err
	}
	// The CA's own roots only: whoever reads root-cert.pem trusts it for
	// this trust domain. The files are staged and renamed together, so a
	// failure leaves no key next to another certificate.
	trust := caclient.Trust{TrustDomain: td, Local: m.Roots}
	if err := caclient.WriteCredentials(o.credsDir, key, withoutRoots(issued.Chain, m.Roots), trust); err != nil {
		return err
	}
	fmt.Fprintf(e.Out, "issued %s, valid until %s\n  %s\n", id, issued.Leaf.NotAfter.UTC().Format(time.RFC3339), o.credsDir)
	return nil
}

// issuingMaterial loads what signs: a plug-in directory, or the active
// root of the data directory under a shared lock. On success the caller
// holds the lock until it has signed, so the server cannot retire the root
// between reading it and signing; on error nothing stays locked.
func issuingMaterial(e cli.Env, o caIssueOptions, id spiffeid.ID) (td spiffeid.TrustDomain, m ca.SigningMaterial, maxTTL time.Duration, unlock func(), err error) {
	unlock = func() {}
	td, m, maxTTL, err = loadIssuingMaterial(e, o, id, &unlock)
	if err != nil {
		unlock()
		unlock = func() {}
	}
	return td, m, maxTTL, unlock, err
}

func loadIssuingMaterial(e cli.Env, o caIssueOptions, id spiffeid.ID, unlockp *func()) (spiffeid.TrustDomain, ca.SigningMaterial, time.Duration, error) {
	var m ca.SigningMaterial
	if o.caDir != "" {
		td := id.TrustDomain()
		if o.td != "" {
			var err error
			if td, err = bundledoc.ParseTrustDomain(o.td); err != nil {
				return td, m, 0, fmt.Errorf("--trust-domain %q: %w", o.td, err)
			}
		}
		p, warnings, err := ca.LoadPluginDir(o.caDir, td, e.Now())
		if err != nil {
			return td, m, 0, err
		}
		for _, w := range warnings {
			fmt.Fprintln(e.Err, "warning:", w)
		}
		m = ca.SigningMaterial{Cert: p.Cert, Key: p.Key, Intermediates: p.Intermediates, Roots: p.Roots}
		return td, m, ca.DefaultConfig().MaxWorkloadTTL, nil
	}
	store := ca.NewStore(o.dataDir)
	unlock, err := store.Lock(false)
	if err != nil {
		return spiffeid.TrustDomain{}, m, 0, err
	}
	*unlockp = unlock
	j, roots, err := store.Load("")
	if err != nil {
		return spiffeid.TrustDomain{}, m, 0, err
	}
	if j == nil {
		return spiffeid.TrustDomain{}, m, 0, fmt.Errorf("no CA state in %s; start `trustbridge server --data-dir %s` first", store.Dir(), o.dataDir)
	}
	if j.UsesKeyManager() {
		return spiffeid.TrustDomain{}, m, 0, errors.New("the CA's keys are in a key manager (--key-manager); use trustbridge ca request against the running server")
	}
	td, err := spiffeid.TrustDomainFromString(j.TrustDomain)
	if err != nil {
		return td, m, 0, err
	}
	m = ca.RootsMaterial(roots)
	if m.Cert == nil {
		return td, m, 0, fmt.Errorf("no active root in %s (a server with --ca-dir keeps none; pass the same --ca-dir)", store.Dir())
	}
	// The server's current maximum: the journal also keeps the largest
	// ever used, which only sets how long retired roots stay published.
	maxTTL := ca.DefaultConfig().MaxWorkloadTTL
	if j.Settings != nil && j.Settings.CurrentMaxWorkloadSeconds > 0 {
		maxTTL = time.Duration(j.Settings.CurrentMaxWorkloadSeconds) * time.Second
	}
	return td, m, maxTTL, nil
}

// withoutRoots is the chain a workload presents: leaf and intermediates;
// verifiers bring their own roots.
func withoutRoots(chain, roots []*x509.Certificate) []*x509.Certificate {
	out := make([]*x509.Certificate, 0, len(chain))
	for _, c := range chain {
		if !slices.ContainsFunc(roots, c.Equal) {
			out = append(out, c)
		}
	}
	return out
}

// whoPublishes says what becomes of a root `ca rotate` prepared in
// dataDir: whether a server holds the directory and will publish it.
func whoPublishes(dataDir string) string {
	h, held, err := datadir.Probe(dataDir)
	switch {
	case err != nil:
		return fmt.Sprintf("a server running on %s publishes it within 30s and activates it 5 refresh hints later (whether one runs is unknown: %v)", dataDir, err)
	case held:
		return fmt.Sprintf("the server holding %s publishes it within 30s and activates it 5 refresh hints later; it is %s", dataDir, h)
	default:
		return fmt.Sprintf("no server is running on %s now: the root is published when one starts there, and activates 5 refresh hints after that", dataDir)
	}
}

func newCARotateCmd(e cli.Env) *cobra.Command {
	var (
		dataDir string
		jwt     bool
	)
	cmd := &cobra.Command{
		Use:   "rotate --data-dir DIR [--jwt]",
		Short: "Prepare a successor root now; it signs only 5 refresh hints after the server publishes it",
		Long: `Prepare a new root now instead of at the active root's half life, with the key
type and lifetime the server recorded in --data-dir. The server publishes it
at its next check (within 30s) and activates it no earlier than 5 of its
refresh hints after that, so federated peers learn it first. If no server
runs, nothing is published or activated until one does; the output says
which server holds --data-dir (its lock file, trustbridge.lock, names it), or
that none does. The server's lock on the data directory does not stop this
command: it writes the CA state under the state's own short lock, as the
server does. A root already waiting is kept; rotate does nothing then.

With --jwt it prepares a successor JWT-SVID signing key instead, with the
same publication lead, and leaves the roots alone (and without it, the JWT
keys): the two are separate keys, and replacing one need not churn the
other. --jwt also works on a plug-in CA's state (--ca-dir), whose JWT keys
are trustbridge's own.`,
		Example: `  trustbridge ca rotate --data-dir /var/lib/trustbridge/data
  trustbridge ca rotate --data-dir /var/lib/trustbridge/data --jwt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if jwt {
				return runCARotateJWT(e, dataDir)
			}
			id, created, err := ca.RequestRotation(dataDir, e.Now())
			if err != nil {
				return err
			}
			if !created {
				fmt.Fprintf(e.Out, "root %s is already prepared and waiting; nothing to do\n", id)
				return nil
			}
			fmt.Fprintf(e.Out, "prepared root %s; %s\n", id, whoPublishes(dataDir))
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "./data", "the server's --data-dir (file storage only; with --storage kube use ca request)")
	cmd.Flags().BoolVar(&jwt, "jwt", false, "prepare a successor JWT-SVID signing key instead of a root")
	return cmd
}

func runCARotateJWT(e cli.Env, dataDir string) error {
	kid, created, err := ca.RequestJWTRotation(dataDir, e.Now())
	if err != nil {
		return err
	}
	if !created {
		fmt.Fprintf(e.Out, "JWT key %s is already prepared and waiting; nothing to do\n", kid)
		return nil
	}
	fmt.Fprintf(e.Out, "prepared JWT key %s; %s\n", kid, whoPublishes(dataDir))
	return nil
}
