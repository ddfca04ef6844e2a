package bundledoc_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

func addFixtureSeeds(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join(fixtureDir, "*.json"))
	canon, _ := filepath.Glob(filepath.Join(fixtureDir, "canonical", "*.json"))
	for _, p := range append(paths, canon...) {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		``, `{}`, `[]`, `null`, `{"keys":[]}`, `{"keys":null}`, `{"keys":[],"keys":[]}`,
		`{"keys":[],"spiffe_sequence":-1}`, `{"keys":[],"spiffe_sequence":1e3}`,
		`{"keys":[],"spiffe_refresh_hint":9223372037}`, `{"keys":[{"kty":"RSA","use":"jwt-svid","kid":"a","n":"AQAB","e":"AQAB"}]}`,
		`{"keys":[{"kty":"EC","use":"x509-svid","crv":"P-256","x5c":[]}]}`, `{"keys":[]} {}`, "{\"keys\":[\"\xff\"]}",
		`{"trust_domains":{"a.org":{"keys":[]},"a.org":{"keys":[]}}}`, `{"trust_domains":{"A":{"keys":[]}}}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseBundle: Parse never panics, and whatever it accepts marshals to a
// canonical document that parses back to an equal bundle with no warnings,
// and marshals again to the same bytes.
func FuzzParseBundle(f *testing.F) {
	addFixtureSeeds(f)
	f.Fuzz(func(t *testing.T, doc []byte) {
		b, warnings, err := bundledoc.Parse(td, doc)
		if err != nil {
			if b != nil || warnings != nil {
				t.Fatalf("error with a result: %v", err)
			}
			return
		}
		canon, err := bundledoc.Marshal(b)
		if err != nil {
			t.Fatalf("accepted bundle does not marshal: %v", err)
		}
		again, warnings, err := bundledoc.Parse(td, canon)
		if err != nil {
			t.Fatalf("canonical form does not parse: %v\n%s", err, canon)
		}
		for _, w := range warnings {
			// Only warnings about content (a root naming another trust
			// domain) may survive; nothing the form caused.
			if w.Ignored || (w.Code != bundledoc.CodeForeignTrustDomain && w.Code != bundledoc.CodeRSAInterop) {
				t.Fatalf("canonical form has warning: %v\n%s", w, canon)
			}
		}
		if !b.Equal(again) {
			t.Fatalf("round trip changed the bundle:\n%s", canon)
		}
		canon2, err := bundledoc.Marshal(again)
		if err != nil || string(canon) != string(canon2) {
			t.Fatalf("marshal is not a fixed point: %v\n%s\n%s", err, canon, canon2)
		}
		// No parser differential: where go-spiffe also accepts the input
		// (it refuses a lot we tolerate, like unknown kty), it must read
		// the same bundle from it, and from our canonical form.
		if theirs, err := spiffebundle.Parse(td, doc); err == nil && !theirs.Equal(b) {
			t.Fatalf("go-spiffe reads a different bundle from the input:\n%s", doc)
		}
		if theirs, err := spiffebundle.Parse(td, canon); err == nil && !theirs.Equal(b) {
			t.Fatalf("go-spiffe reads a different bundle from:\n%s", canon)
		}
	})
}

// FuzzParseBundleMap: ParseMap never panics; accepted maps round-trip.
func FuzzParseBundleMap(f *testing.F) {
	addFixtureSeeds(f)
	f.Fuzz(func(t *testing.T, doc []byte) {
		bundles, _, err := bundledoc.ParseMap(doc)
		if err != nil {
			return
		}
		canon, err := bundledoc.MarshalMap(bundles)
		if err != nil {
			t.Fatalf("accepted map does not marshal: %v", err)
		}
		again, warnings, err := bundledoc.ParseMap(canon)
		if err != nil {
			t.Fatalf("canonical map does not parse: %v\n%s", err, canon)
		}
		if len(again) != len(bundles) {
			t.Fatalf("canonical map differs: %v", warnings)
		}
		for i := range bundles {
			if !bundles[i].Equal(again[i]) {
				t.Fatalf("round trip changed %s", bundles[i].TrustDomain())
			}
		}
	})
}
