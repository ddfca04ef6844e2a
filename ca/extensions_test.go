package ca_test

import (
	"crypto/x509/pkix"
	"encoding/asn1"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// privateOID is under the private enterprise arc, as Sign requires.
var privateOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 32473, 1}

func TestSignExtraExtensions(t *testing.T) {
	root := newSignRoot(t, 365*24*time.Hour, testca.ECP256)
	csr := parsedCSR(t, testca.NewKey(t, testca.ECP256), nil)
	value := []byte{0x05, 0x00}

	issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, csr, workloadID, 0, pkix.Extension{Id: privateOID, Value: value})
	require.NoError(t, err)
	var found []pkix.Extension
	for _, e := range issued.Leaf.Extensions {
		if e.Id.Equal(privateOID) {
			found = append(found, e)
		}
	}
	require.Len(t, found, 1)
	assert.False(t, found[0].Critical)
	assert.Equal(t, value, found[0].Value)
	require.Len(t, issued.Leaf.URIs, 1, "the SAN is still ours")
	assert.Equal(t, workloadID.String(), issued.Leaf.URIs[0].String())

	tests := []struct {
		name   string
		extra  []pkix.Extension
		errHas string
	}{
		{name: "critical", extra: []pkix.Extension{{Id: privateOID, Critical: true, Value: value}}, errHas: "is critical"},
		{name: "replaces the SAN", extra: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: value}}, errHas: "private enterprise arc"},
		{name: "replaces basic constraints", extra: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Value: value}}, errHas: "private enterprise arc"},
		{name: "the arc itself", extra: []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1}, Value: value}}, errHas: "private enterprise arc"},
		{name: "repeated", extra: []pkix.Extension{{Id: privateOID, Value: value}, {Id: privateOID, Value: value}}, errHas: "repeats"},
		{name: "too large", extra: []pkix.Extension{{Id: privateOID, Value: []byte(strings.Repeat("x", 4<<10))}}, errHas: "bytes, more than"},
		{name: "too many", extra: []pkix.Extension{
			{Id: append(privateOID[:len(privateOID):len(privateOID)], 1), Value: value},
			{Id: append(privateOID[:len(privateOID):len(privateOID)], 2), Value: value},
			{Id: append(privateOID[:len(privateOID):len(privateOID)], 3), Value: value},
			{Id: append(privateOID[:len(privateOID):len(privateOID)], 4), Value: value},
			{Id: append(privateOID[:len(privateOID):len(privateOID)], 5), Value: value},
		}, errHas: "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issued, err := ca.Sign(signNow, rootMaterial(root), signPolicy, csr, workloadID, 0, tt.extra...)
			require.Error(t, err)
			assert.Nil(t, issued)
			assert.Contains(t, err.Error(), tt.errHas)
			// A fault in the caller's code, not the client's request.
			for _, sentinel := range []error{ca.ErrInvalidCSR, ca.ErrIdentityNotAllowed, ca.ErrInvalidTTL, ca.ErrInvalidSigningMaterial} {
				assert.NotErrorIs(t, err, sentinel)
			}
		})
	}
}
