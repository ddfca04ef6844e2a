package identitymap

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nodeAgentDoc is the node agent's guide, relative to this package.
const nodeAgentDoc = "../../../docs/node-agent.md"

// TestNodeAgentDocYAML: every ```yaml block of docs/node-agent.md is an
// identity map that Parse reads and Compile accepts for the local trust
// domain, with no conflicting rules, so that an operator can copy any of
// them as written.
func TestNodeAgentDocYAML(t *testing.T) {
	blocks := yamlBlocks(t, nodeAgentDoc)
	require.GreaterOrEqual(t, len(blocks), 2, "%s: the full example and the one today's server grants", nodeAgentDoc)
	for _, b := range blocks {
		origin := nodeAgentDoc + ":" + strconv.Itoa(b.line)
		t.Run("line "+strconv.Itoa(b.line), func(t *testing.T) {
			doc, err := Parse([]byte(b.body), origin)
			require.NoError(t, err)
			require.NotEmpty(t, doc.Rules, "an example without rules shows nothing")
			m, err := Compile(Config{TrustDomain: localTD, Default: doc.Default}, doc.Rules)
			require.NoError(t, err)
			assert.Empty(t, m.Conflicts(), "the guide's examples must not conflict")
		})
	}
}

// TestNodeAgentDocToday: the example the guide says today's server grants
// gives pods of the namespaces it names their Istio-form ID, the only one
// the server grants a node, and nothing to other pods or host processes.
func TestNodeAgentDocToday(t *testing.T) {
	var today *docYAML
	for _, b := range yamlBlocks(t, nodeAgentDoc) {
		if strings.HasPrefix(b.body, "default: none\n") {
			today = &b
		}
	}
	require.NotNil(t, today, "%s: no example with default: none", nodeAgentDoc)
	doc, err := Parse([]byte(today.body), nodeAgentDoc)
	require.NoError(t, err)
	m, err := Compile(Config{TrustDomain: localTD, Default: doc.Default}, doc.Rules)
	require.NoError(t, err)

	id, err := m.Identify(pod("payments", "api", nil))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/payments/sa/api", id.ID.String())
	id, err = m.Identify(pod("checkout", "web", map[string]string{"app": "web"}))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/checkout/sa/web", id.ID.String())

	_, err = m.Identify(pod("checkout", "web", map[string]string{"sidecar.istio.io/inject": "false"}))
	assert.ErrorIs(t, err, ErrNoIdentity)
	_, err = m.Identify(pod("kube-system", "coredns", nil))
	assert.ErrorIs(t, err, ErrNoIdentity)
	_, err = m.Identify(Workload{Unix: true, UID: 0})
	assert.ErrorIs(t, err, ErrNoIdentity)
}

// docYAML is one fenced yaml block and the line its fence opens on.
type docYAML struct {
	body string
	line int
}

// yamlBlocks returns the ```yaml blocks of a Markdown file; a block left
// open fails the test.
func yamlBlocks(t *testing.T, path string) []docYAML {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var (
		out  []docYAML
		cur  *docYAML
		body strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.TrimSpace(line)
		switch {
		case cur == nil && fence == "```yaml":
			cur = &docYAML{line: n}
			body.Reset()
		case cur != nil && fence == "```":
			cur.body = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line)
			body.WriteString("\n")
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a yaml block is not closed", path)
	return out
}
