package bundledoc_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// Benchmarks compare against go-spiffe's spiffebundle, measured in the
// same run (sub-benchmark "baseline:go-spiffe"): the price of strict,
// element-by-element parsing, and of deterministic output.
var benchFixtures = []struct{ file, td string }{
	{"spire.json", "example.org"},
	{"istio.json", "cluster.local"},
}

func BenchmarkParse(b *testing.B) {
	for _, fx := range benchFixtures {
		doc, err := os.ReadFile(filepath.Join(fixtureDir, "canonical", fx.file))
		if err != nil {
			b.Fatal(err)
		}
		tdn := spiffeid.RequireTrustDomainFromString(fx.td)
		b.Run(fx.file+"/baseline:go-spiffe", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := spiffebundle.Parse(tdn, doc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fx.file+"/bundledoc", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := bundledoc.Parse(tdn, doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMarshal(b *testing.B) {
	for _, fx := range benchFixtures {
		doc, err := os.ReadFile(filepath.Join(fixtureDir, "canonical", fx.file))
		if err != nil {
			b.Fatal(err)
		}
		bundle, _, err := bundledoc.Parse(spiffeid.RequireTrustDomainFromString(fx.td), doc)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fx.file+"/baseline:go-spiffe", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bundle.Marshal(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fx.file+"/bundledoc", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bundledoc.Marshal(bundle); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
