package certservice

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"golang.org/x/time/rate"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// One node agent service account is every node's: each of its pods has
// its own budget when it acts for workloads, so one node's workloads
// cannot spend every other node's; a caller asking for itself is charged
// by its identity as before.
func TestAdmissionChargesImpersonationPerPod(t *testing.T) {
	a := newAdmission(Config{RateLimit: rate.Limit(1), RateBurst: 1, MaxRateLimiters: 100, QueueSize: 1, Clock: clocktesting.NewFakeClock(time.Unix(0, 0))})
	agentID := spiffeid.RequireFromString("spiffe://example.org/ns/trustbridge-agent/sa/trustbridge-agent")
	web := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/web")
	api := spiffeid.RequireFromString("spiffe://example.org/ns/shop/sa/api")
	nodeA := authn.Identity{ID: agentID, Pod: authn.PodRef{Namespace: "trustbridge-agent", Name: "a", UID: "uid-a"}}
	nodeB := authn.Identity{ID: agentID, Pod: authn.PodRef{Namespace: "trustbridge-agent", Name: "b", UID: "uid-b"}}

	assert.Nil(t, a.charge(nodeA, web))
	assert.NotNil(t, a.charge(nodeA, api), "node A's budget is spent")
	assert.Nil(t, a.charge(nodeB, web), "node B's is its own")
	assert.Nil(t, a.charge(authn.Identity{ID: web}, web), "the workload's own budget is apart")
	assert.NotNil(t, a.charge(authn.Identity{ID: web}, web))
}
