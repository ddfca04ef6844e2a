package main

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/trustview"
)

func getSnapshot(t *testing.T, admin string) trustview.Snapshot {
	t.Helper()
	code, body := get(t, admin+"/v1/snapshot")
	require.Equal(t, http.StatusOK, code, body)
	var snap trustview.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	return snap
}
