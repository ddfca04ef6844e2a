// Package log is trustbridge log level: read or change the running
// server's log level through the admin API, without a restart.
package log
