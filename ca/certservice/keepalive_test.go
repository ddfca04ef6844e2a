package certservice_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/caclient"
)

// A peer gone without closing its connection holds its WatchBundles
// stream, and a slot of its identity's cap, until keepalive finds it
// gone: that must take minutes, not gRPC's default of two hours, or a
// DaemonSet's agents (one identity) reconnecting after a network blip are
// refused meanwhile. The agents' own pings must pass the enforcement
// policy, or the server would disconnect every agent it streams to.
func TestKeepaliveFindsDeadPeersInMinutes(t *testing.T) {
	assert.LessOrEqual(t, certservice.KeepaliveTime+certservice.KeepaliveTimeout, 2*time.Minute,
		"a dead peer is dropped within two minutes of its last frame")
	assert.Greater(t, certservice.KeepaliveTimeout, time.Duration(0))
	assert.GreaterOrEqual(t, caclient.KeepaliveTime, certservice.KeepaliveMinTime,
		"the agents' pings are within the server's enforcement policy")
	assert.Less(t, caclient.KeepaliveTime, certservice.KeepaliveTime,
		"a live agent's stream is never silent long enough for the server to ping it")
}
