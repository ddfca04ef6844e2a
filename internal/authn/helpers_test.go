package authn

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func randomSerial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func spiffeIDFor(path string) spiffeid.ID {
	return spiffeid.RequireFromPath(localTD, "/"+path)
}

func encodeB64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
