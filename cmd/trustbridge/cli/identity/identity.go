package identity

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/authn/identitymap"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// NewCmd is trustbridge identity.
func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "identity",
		Short: "Explain the identity map: which SPIFFE ID a workload gets from its attested facts, and why",
		Example: `  trustbridge identity explain --namespace payments --service-account api --label app=checkout
  trustbridge identity explain --identity-map ids.yaml --trust-domain example.org --uid 65534 --binary-path /usr/bin/node_exporter`,
	}
	cmd.AddCommand(newExplainCmd(e))
	return cmd
}

type explainOptions struct {
	admin cli.AdminClient
	// The pod's facts.
	namespace, serviceAccount, podName, podUID, node, container string
	labels                                                      []string
	// Offline: the file, and the unix facts only an agent attests.
	file, local, def    string
	host                bool
	uid, gid            int64
	user, group, binary string
}

func newExplainCmd(e cli.Env) *cobra.Command {
	o := explainOptions{uid: -1, gid: -1}
	var output *cli.OutputFlag
	cmd := &cobra.Command{
		Use:   "explain",
		Short: "Show which identity the identity map gives one described workload, which rules selected it, and why",
		Long: `Ask the running server (GET /v1/identity/explain on its admin listener) which
SPIFFE ID its identity map (--identity-map, ClusterIdentityMapping resources)
gives a pod with these facts: the ID it grants a node agent asking for that
pod's identity. The server knows a pod's namespace, service account, name, UID,
labels and node, nothing else: rules that select by unix facts or use the
container in templates are only node agents', and the server never grants
their IDs. Give the facts yourself; nothing is looked up.

With --identity-map FILE (and --trust-domain) it explains from that file
alone, without a server, as a node agent would: then --uid, --gid,
--binary-path, --container, --user and --group describe the process too, and
--host describes a process outside any pod. A file that does not load is the
error, with its line and rule.`,
		Example: `  trustbridge identity explain --namespace payments --service-account api --label app=checkout
  trustbridge identity explain --namespace payments --service-account api -o json
  # offline, from a file, as a node agent
  trustbridge identity explain --identity-map ids.yaml --trust-domain example.org \
    --namespace payments --service-account api --label app=checkout --uid 1000
  trustbridge identity explain --identity-map ids.yaml --trust-domain example.org --host --uid 65534 --binary-path /usr/bin/node_exporter`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := output.Check(); err != nil {
				return err
			}
			ex, err := o.explain(cmd.Context(), cli.AdminFrom(cmd, &o.admin))
			if err != nil {
				return err
			}
			return output.Write(e.Out, ex, func(w io.Writer) error { return printExplanation(w, ex) })
		},
	}
	f := cmd.Flags()
	f.String("admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	o.admin.AddAuthFlags(f)
	f.StringVar(&o.namespace, "namespace", "", "the pod's namespace")
	f.StringVar(&o.serviceAccount, "service-account", "", "the pod's service account")
	f.StringVar(&o.podName, "pod-name", "", "the pod's name")
	f.StringVar(&o.podUID, "pod-uid", "", "the pod's UID")
	f.StringVar(&o.node, "node", "", "the pod's node")
	f.StringArrayVar(&o.labels, "label", nil, "a label of the pod, key=value (repeatable)")
	f.StringVar(&o.file, "identity-map", "", "explain from this identity map file instead of asking a server")
	f.StringVar(&o.local, "trust-domain", "", "with --identity-map: the local trust domain")
	f.StringVar(&o.def, "identity-default", "istio", "with --identity-map: the default of the server or agent (istio or none); none in the file wins")
	f.BoolVar(&o.host, "host", false, "with --identity-map: a process outside any pod (no Kubernetes facts)")
	f.StringVar(&o.container, "container", "", "with --identity-map: the process's container name")
	f.Int64Var(&o.uid, "uid", -1, "with --identity-map: the process's uid (gives it unix facts)")
	f.Int64Var(&o.gid, "gid", -1, "with --identity-map: the process's gid")
	f.StringVar(&o.user, "user", "", "with --identity-map: the process's user name")
	f.StringVar(&o.group, "group", "", "with --identity-map: the process's group name")
	f.StringVar(&o.binary, "binary-path", "", "with --identity-map: the process's executable")
	output = cli.AddOutputFlag(cmd)
	return cmd
}

// explain asks the server, or reads the file.
func (o explainOptions) explain(ctx context.Context, c *cli.AdminClient) (api.IdentityExplanation, error) {
	var ex api.IdentityExplanation
	if o.file != "" {
		return o.offline()
	}
	if o.host || o.uid >= 0 || o.gid >= 0 || o.user != "" || o.group != "" || o.binary != "" || o.container != "" {
		return ex, fmt.Errorf("--host, --uid, --gid, --user, --group, --binary-path and --container need --identity-map: the server knows no process, only pods")
	}
	q := url.Values{"namespace": {o.namespace}, "service_account": {o.serviceAccount}, "label": o.labels}
	for k, v := range map[string]string{"pod_name": o.podName, "pod_uid": o.podUID, "node_name": o.node} {
		if v != "" {
			q.Set(k, v)
		}
	}
	body, err := c.Do(ctx, http.MethodGet, "/v1/identity/explain?"+q.Encode(), nil, false)
	if err != nil {
		return ex, err
	}
	if err := json.Unmarshal([]byte(body), &ex); err != nil {
		return ex, fmt.Errorf("admin answer: %w", err)
	}
	return ex, nil
}

// offline explains the described workload from --identity-map alone.
func (o explainOptions) offline() (api.IdentityExplanation, error) {
	var ex api.IdentityExplanation
	local, err := bundledoc.ParseTrustDomain(o.local)
	if err != nil {
		return ex, fmt.Errorf("--trust-domain %q: %w (with --identity-map, name the local trust domain)", o.local, err)
	}
	def, err := identitymap.ParseDefault(o.def)
	if err != nil {
		return ex, fmt.Errorf("--identity-default: %w", err)
	}
	data, err := cli.ReadSmallFile(o.file, identitymap.MaxDocumentSize)
	if err != nil {
		return ex, err
	}
	doc, err := identitymap.Parse(data, "file:"+o.file)
	if err != nil {
		return ex, err
	}
	if doc.Default == identitymap.DefaultNone {
		def = identitymap.DefaultNone
	}
	m, err := identitymap.Compile(identitymap.Config{TrustDomain: local, Default: def}, doc.Rules)
	if err != nil {
		return ex, err
	}
	w, err := o.workload()
	if err != nil {
		return ex, err
	}
	return api.ExplainIdentity(m, w), nil
}

// workload is the described process.
func (o explainOptions) workload() (identitymap.Workload, error) {
	var w identitymap.Workload
	if !o.host {
		labels, err := parseLabels(o.labels)
		if err != nil {
			return w, err
		}
		w = identitymap.ServerFacts(o.namespace, o.serviceAccount, o.podName, o.podUID, o.node, labels)
		w.ContainerName = o.container
	} else if o.namespace != "" || o.serviceAccount != "" || len(o.labels) > 0 || o.container != "" {
		return w, fmt.Errorf("--host describes a process outside any pod: drop --namespace, --service-account, --label and --container")
	}
	if o.uid > 1<<32-1 || o.gid > 1<<32-1 {
		return w, fmt.Errorf("--uid and --gid: at most 4294967295")
	}
	if o.uid >= 0 || o.gid >= 0 || o.binary != "" || o.user != "" || o.group != "" {
		w.Unix = true
		w.UID, w.GID = uint32(max(o.uid, 0)), uint32(max(o.gid, 0))
		w.User, w.Group, w.BinaryPath = o.user, o.group, o.binary
	}
	return w, nil
}

func parseLabels(kvs []string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

func printExplanation(w io.Writer, ex api.IdentityExplanation) error {
	fmt.Fprintf(w, "%s; default %s, %d rules\n", cli.Printable(describe(ex.Workload)), ex.Default, ex.Rules)
	if len(ex.Matched) == 0 {
		fmt.Fprintln(w, "no rule selects it")
	}
	for _, m := range ex.Matched {
		made := m.SPIFFEID
		if m.Error != "" {
			made = "error: " + m.Error
		}
		fmt.Fprintf(w, "selected by rule %s (%s), workloads[%d] (%s): %s\n", cli.Printable(m.Rule), cli.Printable(m.Origin), m.Selector,
			strings.Join(m.Fields, ", "), cli.Printable(made))
	}
	if ex.SPIFFEID != "" {
		fmt.Fprintf(w, "identity: %s\n", cli.Printable(ex.SPIFFEID))
		if ex.TTL != "" {
			fmt.Fprintf(w, "ttl: %s\n", ex.TTL)
		}
		if len(ex.DNSNames) > 0 {
			fmt.Fprintf(w, "dns names: %s\n", cli.Printable(strings.Join(ex.DNSNames, ", ")))
		}
	} else {
		fmt.Fprintln(w, "identity: none")
	}
	fmt.Fprintf(w, "because: %s\n", cli.Printable(ex.Because))
	if ex.Error != "" {
		fmt.Fprintf(w, "error: %s\n", cli.Printable(ex.Error))
	}
	for _, c := range ex.Conflicts {
		fmt.Fprintf(w, "conflict: %s\n", cli.Printable(c))
	}
	for _, a := range ex.AgentOnly {
		fmt.Fprintf(w, "agent only: %s\n", cli.Printable(a))
	}
	if ex.Note != "" {
		fmt.Fprintf(w, "note: %s\n", cli.Printable(ex.Note))
	}
	return nil
}

// describe names the workload by its facts.
func describe(w api.IdentityWorkload) string {
	var parts []string
	if w.Kubernetes {
		p := fmt.Sprintf("pod %s/%s (service account %s)", w.Namespace, w.PodName, w.ServiceAccount)
		if len(w.PodLabels) > 0 {
			keys := make([]string, 0, len(w.PodLabels))
			for k := range w.PodLabels {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for i, k := range keys {
				keys[i] = k + "=" + w.PodLabels[k]
			}
			p += ", labels " + strings.Join(keys, ",")
		}
		parts = append(parts, p)
	} else {
		parts = append(parts, "host process")
	}
	if w.Unix {
		u := fmt.Sprintf("uid %d gid %d", w.UID, w.GID)
		if w.BinaryPath != "" {
			u += " " + w.BinaryPath
		}
		parts = append(parts, u)
	}
	return strings.Join(parts, ", ")
}
