package bundledoc_test

import (
	"os"
	"path/filepath"
	"reflect"
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

// FuzzParseRevocations: ParseRevocations never panics, and what it accepts
// renders (beside an empty bundle) to a document that parses back to the
// same entries and renders again to the same bytes; the bundle parser
// still reads that document.
func FuzzParseRevocations(f *testing.F) {
	addFixtureSeeds(f)
	x := `"x5t#S256":"47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"`
	for _, s := range []string{
		`{"keys":[],"trustbridge_revoked":[]}`, `{"keys":[],"trustbridge_revoked":null}`,
		`{"keys":[],"trustbridge_revoked":[{"use":"x509-svid",` + x + `,"exp":1767225600}]}`,
		`{"keys":[],"trustbridge_revoked":[{"use":"jwt-svid","kid":"k","exp":1767225600},{"use":"jwt-svid","kid":"k","exp":1}]}`,
		`{"keys":[],"trustbridge_revoked":[{"use":"wit-svid","kid":"w"},{"use":"x509-svid",` + x + `,"kid":"k","exp":1}]}`,
		`{"keys":[],"trustbridge_revoked":[{"use":"jwt-svid","kid":"\ud800","exp":1}]}`,
		`{"keys":[],"trustbridge_revoked":[{"use":"jwt-svid","kid":"k","exp":253402300800}]}`,
	} {
		f.Add([]byte(s))
	}
	empty := spiffebundle.New(td)
	f.Fuzz(func(t *testing.T, doc []byte) {
		revs, err := bundledoc.ParseRevocations(doc)
		if err != nil {
			if revs != nil {
				t.Fatalf("error with a result: %v", err)
			}
			return
		}
		canon, err := bundledoc.MarshalWithRevocations(empty, revs)
		if err != nil {
			t.Fatalf("accepted entries do not marshal: %v", err)
		}
		again, err := bundledoc.ParseRevocations(canon)
		if err != nil || !reflect.DeepEqual(revs, again) {
			t.Fatalf("round trip changed the entries (%v):\n%s", err, canon)
		}
		canon2, err := bundledoc.MarshalWithRevocations(empty, again)
		if err != nil || string(canon) != string(canon2) {
			t.Fatalf("marshal is not a fixed point: %v\n%s\n%s", err, canon, canon2)
		}
		if _, _, err := bundledoc.Parse(td, canon); err != nil {
			t.Fatalf("the bundle parser refuses the canonical form: %v\n%s", err, canon)
		}
	})
}
