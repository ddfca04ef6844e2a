package svidcheck

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net/url"
	"testing"
)

func sanValue(tb testing.TB, uris ...string) []byte {
	var names []asn1.RawValue
	for _, u := range uris {
		names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(u)})
	}
	names = append(names, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte("dns.test")})
	v, err := asn1.Marshal(names)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// FuzzLeafID feeds arbitrary subject alternative name extensions to the
// leaf checks: they must never panic, and an accepted ID must be exactly
// the one URI SAN the extension carries.
func FuzzLeafID(f *testing.F) {
	f.Add(sanValue(f, "spiffe://a.test/w"))
	f.Add(sanValue(f, "spiffe://a.test/w", "spiffe://a.test/x"))
	f.Add(sanValue(f, "spiffe://A.test/w%41/"))
	f.Add(sanValue(f))
	f.Add([]byte{0x30, 0x80})
	f.Fuzz(func(t *testing.T, val []byte) {
		c := &x509.Certificate{
			KeyUsage:   x509.KeyUsageDigitalSignature,
			Extensions: []pkix.Extension{{Id: oidSubjectAltName, Value: val}},
		}
		uris, err := rawURISANs(c)
		if err != nil {
			return
		}
		for _, s := range uris {
			// What crypto/x509's parser would have produced.
			if u, err := url.Parse(s); err == nil {
				c.URIs = append(c.URIs, u)
			}
		}
		id, err := LeafID(c)
		if err != nil {
			return
		}
		if len(uris) != 1 || id.String() != uris[0] {
			t.Fatalf("accepted %q from URI SANs %q", id, uris)
		}
	})
}
