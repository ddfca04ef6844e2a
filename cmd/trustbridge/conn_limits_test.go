package main

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/agent"
	"github.com/trustbridge/trustbridge/internal/server"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
)

func TestListenerLimitFlagDefaults(t *testing.T) {
	server := map[string]string{
		"grpc-max-conns": "2048", "grpc-max-conns-per-source": "512", "grpc-first-call-timeout": "30s",
		"bundle-max-conns": "512", "bundle-max-conns-per-source": "64", "bundle-idle-timeout": "10s",
		"admin-max-conns": "128", "admin-max-conns-per-source": "32",
	}
	agent := map[string]string{"admin-max-conns": "128", "admin-max-conns-per-source": "32"}
	for cmd, want := range map[string]map[string]string{"server": server, "agent": agent} {
		f := newServerCmd(cli.Env{}).Flags()
		if cmd == "agent" {
			f = newAgentCmd(cli.Env{}).Flags()
		}
		for flag, def := range want {
			fl := f.Lookup(flag)
			if assert.NotNil(t, fl, "%s --%s", cmd, flag) {
				assert.Equal(t, def, fl.DefValue, "%s --%s", cmd, flag)
			}
		}
	}
}

func TestListenerLimitErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*server.Config)
		want   string
	}{
		{"grpc total", func(o *server.Config) { o.GRPC.Conns.Max = -1 }, "--grpc-max-conns -1: must not be negative (0 takes the default, 2048)"},
		{"grpc per source", func(o *server.Config) { o.GRPC.Conns.PerSource = -2 }, "--grpc-max-conns-per-source -2"},
		{"bundle total", func(o *server.Config) { o.Bundle.Conns.Max = -1 }, "--bundle-max-conns -1"},
		{"admin per source", func(o *server.Config) { o.AdminConns.PerSource = -1 }, "--admin-max-conns-per-source -1"},
		{"first call", func(o *server.Config) { o.GRPC.FirstCallTimeout = -time.Second }, "--grpc-first-call-timeout -1s"},
		{"bundle idle", func(o *server.Config) { o.Bundle.IdleTimeout = -time.Second }, "--bundle-idle-timeout -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := baseServerOptions("example.org", t.TempDir())
			tt.mutate(&o)
			assert.ErrorContains(t, server.CheckListenerLimits(o), tt.want)
			err := serverError(t, o)
			require.Error(t, err, "the server refuses to start")
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Setenv("TRUST_DOMAIN", "")
	bad := servertest.WriteConfig(t, "trust-domain: east.example\ngrpc-max-conns: -1\nbundle-idle-timeout: -1s\n")
	out, _, code := runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "--grpc-max-conns -1")
	assert.Contains(t, out, "--bundle-idle-timeout -1s")
}

// The agent's admin listener has its limits too.
func TestAgentAdminConnLimits(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, _, logs := testEnv(t, "json")
	logger, err := server.NewLogger(logs, "json", "info")
	require.NoError(t, err)
	ready := agentReadinessFunc(func() error { return nil })
	o := agent.AdminConfig{Listen: "127.0.0.1:0", Conns: server.ConnLimits{Max: 1, PerSource: 1}}
	stop, err := agent.StartSide(context.Background(), e.HUP, o, ready, reg, logger)
	require.NoError(t, err)
	defer stop()
	admin := servertest.LogAttr(t, logs.String(), "admin listening", "address")

	held := servertest.FloodConn(t, admin, "127.0.0.1", servertest.FloodHTTP)
	require.NotNil(t, held, "the first connection is served")
	defer held.Close()
	assert.Nil(t, servertest.FloodConn(t, admin, "127.0.0.1", servertest.FloodHTTP), "the second is refused at accept")
	assert.Equal(t, float64(1), gathered(t, reg, "trustbridge_listener_connections_refused_total", map[string]string{"listener": "admin", "reason": "source_limit"}))

	o.Conns.Max = -1
	_, err = agent.StartSide(context.Background(), e.HUP, o, ready, prometheus.NewRegistry(), logger)
	assert.ErrorContains(t, err, "--admin-max-conns -1")
}

type agentReadinessFunc func() error

func (f agentReadinessFunc) Ready() error { return f() }

// gathered is the value of the counter name whose labels are labels,
// gathered from reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if maps.Equal(got, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s%v in the registry", name, labels)
	return 0
}

// The admin CLI's client leaves no idle connection behind: one process
// making many admin calls (a script, a test) stays under the admin
// listener's per-source limit instead of being reset by it.
func TestAdminClientStaysUnderPerSourceLimit(t *testing.T) {
	o := baseServerOptions("example.org", t.TempDir())
	o.AdminConns = server.ConnLimits{Max: 8, PerSource: 3} // one spare: the server may not yet have seen the last call's close
	admin, _, _ := launchServer(t, o)
	c := &cli.AdminClient{Addr: "http://" + admin}
	for i := range 10 {
		_, err := c.Do(context.Background(), "GET", "/v1/federation/relationships", nil, false)
		require.NoError(t, err, "call %d", i)
	}
}
