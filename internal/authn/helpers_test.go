package authn

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
)

func randomSerial(t testing.TB) *big.Int {
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

// exactlyOneConsumes runs consume(0..n-1) at once and checks that exactly
// one consumes the token and every other finds it consumed; who names the
// racers in the message.
func exactlyOneConsumes(t *testing.T, n int, consume func(i int) error, who string) {
	t.Helper()
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = consume(i)
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		assert.ErrorIs(t, err, ErrTokenConsumed)
	}
	assert.Equal(t, 1, won, "exactly one %s consumes the token: %v", who, errs)
}
