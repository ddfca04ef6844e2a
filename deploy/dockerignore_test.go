package deploy

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dockerignore is a .dockerignore as Docker reads it: patterns relative to
// the context root, * and ? within one path element, ** across elements, a
// leading ! re-including, the last matching line deciding, and a directory
// taking its content with it.
type dockerignore []struct {
	re      *regexp.Regexp
	exclude bool
}

func parseDockerignore(t *testing.T, file string) dockerignore {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	var d dockerignore
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		neg := strings.HasPrefix(line, "!")
		line = strings.TrimPrefix(path.Clean(strings.TrimPrefix(line, "!")), "/")
		d = append(d, struct {
			re      *regexp.Regexp
			exclude bool
		}{globRegexp(line), !neg})
	}
	return d
}

func globRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		switch {
		case strings.HasPrefix(pattern[i:], "**/"):
			b.WriteString("(.*/)?")
			i += 2
		case strings.HasPrefix(pattern[i:], "**"):
			b.WriteString(".*")
			i++
		case pattern[i] == '*':
			b.WriteString("[^/]*")
		case pattern[i] == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		}
	}
	return regexp.MustCompile("^" + b.String() + "$")
}

// ignored says whether p (slash-separated, relative to the context) is
// left out of the build context.
func (d dockerignore) ignored(p string) bool {
	out := false
	for _, rule := range d {
		for q := p; q != "."; q = path.Dir(q) {
			if rule.re.MatchString(q) {
				out = rule.exclude
				break
			}
		}
	}
	return out
}

func TestDockerignoreMatcher(t *testing.T) {
	d := dockerignore{}
	for _, l := range []struct {
		p  string
		ex bool
	}{{"data", true}, {"**/*.pem", true}, {"bin", true}, {"!bin/keep.txt", false}} {
		d = append(d, struct {
			re      *regexp.Regexp
			exclude bool
		}{globRegexp(strings.TrimPrefix(l.p, "!")), l.ex})
	}
	for p, want := range map[string]bool{
		"data": true, "data/ca/key.pem": true, "x/data": false, "a.pem": true, "a/b/c.pem": true,
		"a/b.pem.go": false, "bin/trustbridge": true, "bin/keep.txt": false, "binary.go": false,
	} {
		assert.Equal(t, want, d.ignored(p), p)
	}
}

// makeRunDataDirs are the --data-dir values of the Makefile's run target.
func makeRunDataDirs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "Makefile"))
	require.NoError(t, err)
	_, run, ok := strings.Cut(string(data), "\nrun:")
	require.True(t, ok, "the Makefile has a run target")
	run, _, _ = strings.Cut(run, "\n\n")
	dirs := regexp.MustCompile(`--data-dir[ =](\S+)`).FindAllStringSubmatch(run, -1)
	require.NotEmpty(t, dirs, "make run passes --data-dir")
	var out []string
	for _, m := range dirs {
		out = append(out, path.Clean(m[1]))
	}
	return out
}

// Nothing make run writes (the CA's private keys in ./data), no build
// output and no key material enters the Docker build context.
func TestDockerignoreLeavesOutStateAndKeys(t *testing.T) {
	d := parseDockerignore(t, filepath.Join("..", ".dockerignore"))
	paths := []string{
		"bin", "bin/trustbridge", "bin/kube/kube-apiserver", "bin/trustbridge-image.tar", "trustbridge",
		".git", ".git/config", "backup.tar", "audit.jsonl",
		"key.pem", "deploy/x/ca-key.pem", "cacerts/ca-cert.pem", "web/tls.key", "tb.p12",
		"cmd/trustbridge/trustbridge.test", "cover.out", "cmd/trustbridge/testdata/fuzz/FuzzX/1",
	}
	for _, dir := range makeRunDataDirs(t) {
		paths = append(paths, dir, dir+"/ca/state.json", dir+"/ca/root-1-key.pem", dir+"/trustbridge.lock", dir+"/audit.jsonl")
	}
	for _, p := range paths {
		assert.True(t, d.ignored(p), "%s must be in .dockerignore", p)
	}
}

// Everything the Docker build compiles or embeds is in the context: the
// Go files and go:embed files of ./cmd/trustbridge's packages in this
// module, go.mod and go.sum.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	d := parseDockerignore(t, filepath.Join("..", ".dockerignore"))
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	// The go command running this test (go test puts its GOROOT/bin
	// first on PATH).
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles", "./cmd/trustbridge")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err)
	inputs := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			Dir                 string
			Module              *struct{ Main bool }
			GoFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		require.NoError(t, err)
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			inputs = append(inputs, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	require.Greater(t, len(inputs), 50)
	for _, p := range inputs {
		assert.False(t, d.ignored(p), "%s is a build input but .dockerignore leaves it out", p)
	}
}
