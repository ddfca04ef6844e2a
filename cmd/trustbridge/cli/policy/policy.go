package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Explain and check the trust policy: which workloads may trust which federated trust domains",
		Example: `  trustbridge policy explain spiffe://example.org/ns/payments/sa/api
  trustbridge policy check policy.yaml`,
	}
	cmd.AddCommand(newPolicyExplainCmd(e), newPolicyCheckCmd(e))
	return cmd
}

type policyExplainOptions struct {
	admin                     cli.AdminClient
	namespace, serviceAccount string
	file, local, federated    string
	def                       string
}

func newPolicyExplainCmd(e cli.Env) *cobra.Command {
	var o policyExplainOptions
	var output *cli.OutputFlag
	cmd := &cobra.Command{
		Use:   "explain SPIFFE_ID",
		Short: "Show what one workload would receive of each trust domain, and which rule (or the default) decided",
		Long: `Ask the running server (GET /v1/policy/explain on its admin listener) what
the workload with this SPIFFE ID would receive of every trust domain the server
trusts, with which peers, and why. A workload that proves a Kubernetes service
account is also selected by namespace and label rules: give --namespace and
--service-account. The server reads that service account's labels only for the
admin: the command sends the admin token when it can read it (--data-dir,
--admin-token-file) and --admin is loopback or https, and none is needed on the
admin socket; without it, label rules are explained as not selecting. With --trust-policy FILE (and --trust-domain) it explains
from that file alone, without a server; --federated lists the trust domains to
explain then.`,
		Example: `  trustbridge policy explain spiffe://example.org/ns/payments/sa/api
  trustbridge policy explain spiffe://example.org/ns/payments/sa/api --namespace payments --service-account api -o json
  # offline, from a file
  trustbridge policy explain spiffe://example.org/ns/payments/sa/api --trust-policy policy.yaml \
    --trust-domain example.org --federated partner.example,other.example`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.Check(); err != nil {
				return err
			}
			ex, err := o.explain(cmd.Context(), cli.AdminFrom(cmd, &o.admin), args[0])
			if err != nil {
				return err
			}
			return output.Print(e.Out, ex, explanationTable(ex))
		},
	}
	f := cmd.Flags()
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	o.admin.AddAuthFlags(f)
	f.StringVar(&o.namespace, "namespace", "", "the Kubernetes namespace of the service account the workload proves")
	f.StringVar(&o.serviceAccount, "service-account", "", "the service account the workload proves")
	f.StringVar(&o.file, "trust-policy", "", "explain from this policy file instead of asking a server")
	f.StringVar(&o.local, "trust-domain", "", "with --trust-policy: the local trust domain")
	f.StringVar(&o.federated, "federated", "", "with --trust-policy: the federated trust domains to explain, comma-separated (default: those the file names)")
	f.StringVar(&o.def, "trust-policy-default", "allow", "with --trust-policy: the server's --trust-policy-default")
	output = cli.AddOutputFlag(cmd)
	return cmd
}

// explain asks the server, or reads the file.
func (o policyExplainOptions) explain(ctx context.Context, c *cli.AdminClient, id string) (api.Explanation, error) {
	var ex api.Explanation
	if o.file != "" {
		return o.offline(id)
	}
	q := url.Values{"spiffe_id": {id}}
	if o.namespace != "" || o.serviceAccount != "" {
		q.Set("namespace", o.namespace)
		q.Set("service_account", o.serviceAccount)
	}
	body, err := c.Do(ctx, http.MethodGet, "/v1/policy/explain?"+q.Encode(), nil, c.MayAuthenticate())
	if err != nil {
		return ex, err
	}
	if err := json.Unmarshal([]byte(body), &ex); err != nil {
		return ex, fmt.Errorf("admin answer: %w", err)
	}
	return ex, nil
}

// offline explains id from --trust-policy alone.
func (o policyExplainOptions) offline(id string) (api.Explanation, error) {
	var ex api.Explanation
	local, err := bundledoc.ParseTrustDomain(o.local)
	if err != nil {
		return ex, fmt.Errorf("--trust-domain %q: %w (with --trust-policy, name the local trust domain)", o.local, err)
	}
	sid, err := spiffeid.FromString(id)
	if err != nil || !sid.MemberOf(local) {
		return ex, fmt.Errorf("SPIFFE ID %q: want a workload of %s", id, local.Name())
	}
	def, err := trustpolicy.ParseDefault(o.def)
	if err != nil {
		return ex, fmt.Errorf("--trust-policy-default: %w", err)
	}
	p, err := compilePolicyFile(o.file, local, def)
	if err != nil {
		return ex, err
	}
	tds := []spiffeid.TrustDomain{local}
	names := strings.Split(o.federated, ",")
	if o.federated == "" {
		names = nil
		for _, r := range p.Rules() {
			for _, g := range r.TrustDomains {
				names = append(names, g.TrustDomain)
			}
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		td, err := bundledoc.ParseTrustDomain(strings.TrimSpace(n))
		if err != nil {
			return ex, fmt.Errorf("--federated %q: %w", n, err)
		}
		if !seen[td.Name()] && td != local {
			seen[td.Name()] = true
			tds = append(tds, td)
		}
	}
	sub := trustpolicy.Subject{ID: sid, Namespace: o.namespace, ServiceAccount: o.serviceAccount}
	return api.Explain(p, sub, tds), nil
}

// compilePolicyFile reads, parses and compiles a policy file as the
// server would, with def as --trust-policy-default (the stricter wins).
func compilePolicyFile(path string, local spiffeid.TrustDomain, def trustpolicy.Default) (*trustpolicy.Policy, error) {
	doc, err := parsePolicyFile(path)
	if err != nil {
		return nil, err
	}
	if doc.Default == trustpolicy.DefaultDeny {
		def = trustpolicy.DefaultDeny
	}
	return trustpolicy.Compile(local, def, doc.Rules)
}

// parsePolicyFile reads and parses a policy file as the server would.
func parsePolicyFile(path string) (trustpolicy.Document, error) {
	data, err := cli.ReadSmallFile(path, trustpolicy.MaxDocumentSize)
	if err != nil {
		return trustpolicy.Document{}, err
	}
	return trustpolicy.Parse(data, "file:"+path)
}

// explanationTable is ex for people: who the workload is and which rules
// selected it above one row per trust domain, named by it.
func explanationTable(ex api.Explanation) cli.Table {
	who := ex.SPIFFEID
	if ex.Namespace != "" {
		who += fmt.Sprintf(" (service account %s/%s)", ex.Namespace, ex.ServiceAccount)
	}
	before := []string{fmt.Sprintf("%s, default %s", who, ex.Default)}
	if ex.LabelsNote != "" {
		before = append(before, cli.Printable(ex.LabelsNote))
	}
	if len(ex.Matched) == 0 {
		before = append(before, "no rule selects it")
	}
	for _, m := range ex.Matched {
		before = append(before, fmt.Sprintf("selected by rule %s (%s), workloads[%d]", m.Rule, m.Origin, m.Selector))
	}
	t := cli.Table{
		Columns: []cli.Column{{Name: "Trust domain"}, {Name: "Trusted"}, {Name: "Peers"}, {Name: "Because"}},
		Before:  strings.Join(before, "\n") + "\n\n",
		Empty:   strings.Join(before, "\n"),
	}
	for _, td := range ex.TrustDomains {
		trusted, peers := "no", "-"
		if td.Trusted {
			trusted, peers = "yes", "every member"
			if len(td.Peers) > 0 {
				peers = strings.Join(td.Peers, ",")
			}
		}
		t.Rows = append(t.Rows, cli.Row{Name: td.TrustDomain, Cells: []any{cli.Printable(td.TrustDomain), trusted, cli.Printable(peers), cli.Printable(td.Because)}})
	}
	return t
}

func newPolicyCheckCmd(e cli.Env) *cobra.Command {
	var local, def string
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Check a trust policy file as the server would load it; exit 1 with file:line and rule when it is bad",
		Example: `  trustbridge policy check policy.yaml
  trustbridge policy check policy.yaml --trust-domain example.org   # also the checks that need the local trust domain`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if local == "" {
				doc, err := parsePolicyFile(args[0])
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(e.Out, "%s: %d rules, default %s (give --trust-domain to check against the local trust domain too)\n", args[0], len(doc.Rules), cmpDefault(doc.Default))
				return err
			}
			td, err := bundledoc.ParseTrustDomain(local)
			if err != nil {
				return fmt.Errorf("--trust-domain %q: %w", local, err)
			}
			d, err := trustpolicy.ParseDefault(def)
			if err != nil {
				return fmt.Errorf("--trust-policy-default: %w", err)
			}
			p, err := compilePolicyFile(args[0], td, d)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(e.Out, "%s: %d rules, default %s\n", args[0], len(p.Rules()), p.Default())
			return err
		},
	}
	cmd.Flags().StringVar(&local, "trust-domain", "", "the server's trust domain")
	cmd.Flags().StringVar(&def, "trust-policy-default", "allow", "the server's --trust-policy-default")
	return cmd
}

func cmpDefault(d trustpolicy.Default) string {
	if d == "" {
		return "not set (the server's --trust-policy-default)"
	}
	return string(d)
}
