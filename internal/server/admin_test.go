package server

import "github.com/trustbridge/trustbridge/internal/server/admin"

// trustDoc is the answer of GET /v1/trust, under the name the server tests
// used before the admin API moved to internal/admin.
type trustDoc = admin.Trust
