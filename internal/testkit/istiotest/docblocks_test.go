package istiotest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// istioDoc is the guide the TestIstioDoc* tests check, relative to this
// package.
const istioDoc = "../../../docs/istio.md"

// docBlock is one fenced block of docs/istio.md, named by the
// "<!-- istio-doc: NAME -->" line before it.
type docBlock struct {
	name string
	lang string
	body string
	line int
}

var (
	docMarker = regexp.MustCompile(`^\s*<!-- istio-doc: (\S+) -->\s*$`)
	docFence  = regexp.MustCompile("^(\\s*)```(\\S*)\\s*$")
)

// readDocBlocks returns every fenced block of the guide by name. A block
// without a marker, a marker without a block, or a name used twice fails
// the test: every block the reader sees must be one a test checks.
func readDocBlocks(t *testing.T) map[string]docBlock {
	t.Helper()
	f, err := os.Open(istioDoc)
	require.NoError(t, err)
	defer f.Close()
	blocks := map[string]docBlock{}
	var (
		pending string // marker name waiting for its fence
		cur     *docBlock
		indent  string
		body    strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if cur != nil {
			if m := docFence.FindStringSubmatch(line); m != nil && m[2] == "" {
				cur.body = body.String()
				blocks[cur.name] = *cur
				cur = nil
				continue
			}
			body.WriteString(strings.TrimPrefix(line, indent))
			body.WriteString("\n")
			continue
		}
		if m := docMarker.FindStringSubmatch(line); m != nil {
			require.Empty(t, pending, "%s:%d: marker %q follows marker %q without a block", istioDoc, n, m[1], pending)
			pending = m[1]
			continue
		}
		m := docFence.FindStringSubmatch(line)
		if m == nil {
			if strings.TrimSpace(line) != "" {
				require.Empty(t, pending, "%s:%d: marker %q is not right before a fenced block", istioDoc, n, pending)
			}
			continue
		}
		require.NotEmpty(t, pending, "%s:%d: a fenced block without an <!-- istio-doc: NAME --> marker: no test checks it", istioDoc, n)
		_, dup := blocks[pending]
		require.False(t, dup, "%s:%d: block name %q used twice", istioDoc, n, pending)
		cur = &docBlock{name: pending, lang: m[2], line: n}
		indent = m[1]
		body.Reset()
		pending = ""
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a fenced block is not closed", istioDoc)
	require.Empty(t, pending, "%s: marker %q at the end without a block", istioDoc, pending)
	return blocks
}

// block returns the named block, which must have the language lang.
func block(t *testing.T, blocks map[string]docBlock, name, lang string) docBlock {
	t.Helper()
	b, ok := blocks[name]
	require.True(t, ok, "%s has no block %q (<!-- istio-doc: %s -->)", istioDoc, name, name)
	require.Equal(t, lang, b.lang, "%s:%d: block %q", istioDoc, b.line, name)
	return b
}

// commandLines joins a shell block's backslash continuations and drops
// comments and blank lines.
func commandLines(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			continue
		}
		cur.WriteString(line)
		joined := strings.TrimSpace(cur.String())
		cur.Reset()
		if joined != "" && !strings.HasPrefix(joined, "#") {
			out = append(out, joined)
		}
	}
	return out
}

// shellWords is the first command of a line, see shellSegments.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	segs := shellSegments(t, line)
	if len(segs) == 0 {
		return nil
	}
	return segs[0]
}

// shellSegments splits one command line as the shell would for the plain
// words, single and double quotes used in the guide, into the commands
// of its pipes and lists (|, ;, &&); a redirection's target and a comment
// are dropped.
func shellSegments(t *testing.T, line string) [][]string {
	t.Helper()
	var segs [][]string
	var words []string
	var cur strings.Builder
	inWord, redirect := false, false
	var quote rune
	endWord := func() {
		if inWord && !redirect {
			words = append(words, cur.String())
		}
		if inWord {
			redirect = false
		}
		cur.Reset()
		inWord = false
	}
	endSeg := func() {
		endWord()
		if len(words) > 0 {
			segs = append(segs, words)
		}
		words = nil
	}
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			endWord()
		case r == '#' && !inWord:
			endSeg()
			return segs
		case r == '|' || r == ';' || r == '&':
			endSeg()
		case r == '>' || r == '<':
			endWord()
			redirect = true
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	require.Zero(t, quote, "unterminated quote in %q", line)
	endSeg()
	return segs
}

func TestShellWords(t *testing.T) {
	tests := []struct {
		line string
		want []string
	}{
		{`trustbridge server --bundle-listen "" --x 'a b'`, []string{"trustbridge", "server", "--bundle-listen", "", "--x", "a b"}},
		{`trustbridge audit --admin http://x # why`, []string{"trustbridge", "audit", "--admin", "http://x"}},
		{`curl -s http://x | trustbridge bundle inspect -o pem - > f`, []string{"curl", "-s", "http://x"}},
		{`a 'x|y' | b`, []string{"a", "x|y"}},
		{`kubectl get cm -o jsonpath='{.data.root-cert\.pem}'`, []string{"kubectl", "get", "cm", "-o", `jsonpath={.data.root-cert\.pem}`}},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			require.Equal(t, tt.want, shellWords(t, tt.line))
		})
	}
}

func TestShellSegments(t *testing.T) {
	got := shellSegments(t, `mkdir -p d && cp a d/b; curl -s u | trustbridge x -o pem - > f # c`)
	require.Equal(t, [][]string{{"mkdir", "-p", "d"}, {"cp", "a", "d/b"}, {"curl", "-s", "u"}, {"trustbridge", "x", "-o", "pem", "-"}}, got)
}

func TestCommandLines(t *testing.T) {
	got := commandLines("# c\na \\\n  b\n\nc # d\n")
	require.Equal(t, []string{"a   b", "c # d"}, got)
}

// docDir is a scratch directory for the guide's local steps.
func docDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	return dir
}
