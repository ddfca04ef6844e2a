package api

// LogLevel is GET and PUT /v1/log/level: the level of the server's logs
// (debug, info, warn, error), changed at run time by `trustbridge log
// level` until the next restart, which applies --log-level again.
type LogLevel struct {
	Level string `json:"level"`
	// Previous is set on the answer to a change: the level it replaced.
	Previous string `json:"previous,omitempty"`
}

// TokenReload is POST /v1/bootstrap-tokens/reload: --bootstrap-token-file
// re-read now (`trustbridge token revoke`), rather than at the next poll.
type TokenReload struct {
	// Tokens is how many tokens are in force after the reload.
	Tokens int `json:"tokens"`
	// Added and Removed count the tokens this reload added and removed
	// (none when the server's own poll read the change first).
	Added   int `json:"added"`
	Removed int `json:"removed"`
}
