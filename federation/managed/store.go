package managed

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/fileutil"
)

// Files in the data directory.
const (
	EndpointsFile = "federation-managed.yaml"
	BundlesFile   = "federation-bundles.json"
)

// maxFileSize bounds what Load reads: a bundle is at most
// bundledoc.DefaultMaxSize, and a few peers' bundles fit well under this.
const maxFileSize = 16 << 20

// State is the managed federation: endpoints and static bundles, each
// sorted by trust domain, no trust domain in both.
type State struct {
	Endpoints []federation.Endpoint
	Bundles   []*spiffebundle.Bundle
}

// TrustDomains are the trust domains s sets, endpoints' then bundles'.
func (s State) TrustDomains() []spiffeid.TrustDomain {
	tds := make([]spiffeid.TrustDomain, 0, len(s.Endpoints)+len(s.Bundles))
	for _, ep := range s.Endpoints {
		tds = append(tds, ep.TrustDomain)
	}
	for _, b := range s.Bundles {
		tds = append(tds, b.TrustDomain())
	}
	return tds
}

func (s State) clone() State {
	return State{Endpoints: slices.Clone(s.Endpoints), Bundles: slices.Clone(s.Bundles)}
}

func (s *State) sort() {
	slices.SortFunc(s.Endpoints, func(a, b federation.Endpoint) int { return cmp.Compare(a.TrustDomain.Name(), b.TrustDomain.Name()) })
	slices.SortFunc(s.Bundles, func(a, b *spiffebundle.Bundle) int {
		return cmp.Compare(a.TrustDomain().Name(), b.TrustDomain().Name())
	})
}

// Load reads the state persisted in dir; missing files are an empty
// state. Warnings are elements the parsers ignored.
func Load(dir string) (State, []string, error) {
	eps, err := readOptional(filepath.Join(dir, EndpointsFile))
	if err != nil {
		return State{}, nil, err
	}
	bundles, err := readOptional(filepath.Join(dir, BundlesFile))
	if err != nil {
		return State{}, nil, err
	}
	s, warnings, err := Parse(eps, bundles)
	if err != nil {
		return State{}, nil, fmt.Errorf("%s: %w", dir, err)
	}
	return s, warnings, nil
}

// Parse parses the two files' contents (nil: absent) into a State with
// the rules of the --federation-config parser and the bundle checks: a
// bundle naming another trust domain is refused, as the poller refuses it.
func Parse(endpoints, bundles []byte) (State, []string, error) {
	var s State
	cfg, err := federation.ParseConfig(endpoints, nil)
	if err != nil {
		return State{}, nil, fmt.Errorf("%s: %w", EndpointsFile, err)
	}
	s.Endpoints, s.Bundles = cfg.Endpoints, nil
	warnings := cfg.Warnings
	if len(bytes.TrimSpace(bundles)) > 0 {
		bs, ws, err := bundledoc.ParseMap(bundles)
		if err != nil {
			return State{}, nil, fmt.Errorf("%s: %w", BundlesFile, err)
		}
		if err := federation.RefusedWarning(ws); err != nil {
			return State{}, nil, fmt.Errorf("%s: %w", BundlesFile, err)
		}
		for _, w := range ws {
			warnings = append(warnings, BundlesFile+": "+w.String())
		}
		s.Bundles = bs
	}
	for _, b := range s.Bundles {
		if b.Empty() {
			return State{}, nil, fmt.Errorf("%s: the bundle of %q has no X.509 or JWT authority", BundlesFile, b.TrustDomain().Name())
		}
	}
	// A trust domain in both files is an add of a trust domain with a
	// static bundle that stopped between the two writes (Save writes the
	// endpoints first): the endpoint, the newer state, wins; its
	// trustDomainBundle holds the roots the add took over.
	s.Bundles = slices.DeleteFunc(s.Bundles, func(b *spiffebundle.Bundle) bool {
		if !slices.ContainsFunc(s.Endpoints, func(ep federation.Endpoint) bool { return ep.TrustDomain == b.TrustDomain() }) {
			return false
		}
		warnings = append(warnings, fmt.Sprintf("%s: trust domain %q also has an endpoint in %s (an add interrupted between the two writes): the endpoint is kept, the static bundle dropped", BundlesFile, b.TrustDomain().Name(), EndpointsFile))
		return true
	})
	s.sort()
	return s, warnings, nil
}

// readOptional reads a file that may be absent (nil, nil).
func readOptional(path string) ([]byte, error) {
	data, _, err := fileutil.ReadFile(path, maxFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// Save writes s into dir, each file atomically, mode 0600; a file whose
// part of s is empty is removed. The endpoints are written first: a crash
// between the two writes leaves a trust domain in both files at worst,
// which Parse resolves, never in neither (its static bundle lost).
func Save(dir string, s State) error {
	eps, err := MarshalEndpoints(s.Endpoints)
	if err != nil {
		return err
	}
	if err := writeOrRemove(filepath.Join(dir, EndpointsFile), eps, len(s.Endpoints) > 0); err != nil {
		return err
	}
	var bundles []byte
	if len(s.Bundles) > 0 {
		if bundles, err = bundledoc.MarshalMap(s.Bundles); err != nil {
			return fmt.Errorf("%s: %w", BundlesFile, err)
		}
	}
	return writeOrRemove(filepath.Join(dir, BundlesFile), bundles, len(s.Bundles) > 0)
}

func writeOrRemove(path string, data []byte, keep bool) error {
	if keep {
		return fileutil.Write(path, data, 0o600)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// header says what the endpoints file is, for the operator who opens it.
const header = `# Federation relationships added at run time (trustbridge federation add),
# written by the server: change them with trustbridge federation add|remove
# while it runs. Same schema as --federation-config: to make one permanent,
# move its entry there and remove it here (with the server stopped).
`

// MarshalEndpoints writes eps in the --federation-config schema, each
// bootstrap bundle inline as its canonical document, so that
// federation.ParseConfig reads back the same endpoints.
func MarshalEndpoints(eps []federation.Endpoint) ([]byte, error) {
	items := make([]federation.ConfigEntry, 0, len(eps))
	for _, ep := range eps {
		it, err := federation.EntryOf(ep)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	var buf bytes.Buffer
	buf.WriteString(header)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(map[string][]federation.ConfigEntry{"federation": items}); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
