// Package config is trustbridge config check: a server --config file read
// as trustbridge server reads it and checked without starting anything
// (server.CheckConfig).
package config
