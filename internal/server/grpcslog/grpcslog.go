package grpcslog

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
)

// Logger is a grpclog.LoggerV2 writing to a slog.Logger that may be set
// (and replaced) after grpclog.SetLoggerV2, which must run before any
// grpc call and is not safe beside one.
type Logger struct {
	l    atomic.Pointer[slog.Logger]
	exit func(int)
}

// New returns a Logger that discards records until Set.
func New() *Logger {
	return &Logger{exit: os.Exit}
}

// Set makes l receive grpc's records from now on; nil discards them.
func (g *Logger) Set(l *slog.Logger) { g.l.Store(l) }

func (g *Logger) log(level slog.Level, msg func() string) {
	l := g.l.Load()
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	l.Log(context.Background(), level, msg())
}

func sprint(args []any) func() string { return func() string { return fmt.Sprint(args...) } }
func sprintln(args []any) func() string {
	return func() string { return strings.TrimSuffix(fmt.Sprintln(args...), "\n") }
}
func sprintf(format string, args []any) func() string {
	return func() string { return fmt.Sprintf(format, args...) }
}

// Info logs at debug: grpc's info records are transport chatter.
func (g *Logger) Info(args ...any)                 { g.log(slog.LevelDebug, sprint(args)) }
func (g *Logger) Infoln(args ...any)               { g.log(slog.LevelDebug, sprintln(args)) }
func (g *Logger) Infof(format string, args ...any) { g.log(slog.LevelDebug, sprintf(format, args)) }

// Warning logs at debug, as grpclog's default hides warnings: failed
// connection attempts, which callers report themselves.
func (g *Logger) Warning(args ...any)                 { g.log(slog.LevelDebug, sprint(args)) }
func (g *Logger) Warningln(args ...any)               { g.log(slog.LevelDebug, sprintln(args)) }
func (g *Logger) Warningf(format string, args ...any) { g.log(slog.LevelDebug, sprintf(format, args)) }

// Error logs at error.
func (g *Logger) Error(args ...any)                 { g.log(slog.LevelError, sprint(args)) }
func (g *Logger) Errorln(args ...any)               { g.log(slog.LevelError, sprintln(args)) }
func (g *Logger) Errorf(format string, args ...any) { g.log(slog.LevelError, sprintf(format, args)) }

// Fatal logs at error and exits with status 1, as grpclog requires.
func (g *Logger) Fatal(args ...any)   { g.log(slog.LevelError, sprint(args)); g.exit(1) }
func (g *Logger) Fatalln(args ...any) { g.log(slog.LevelError, sprintln(args)); g.exit(1) }
func (g *Logger) Fatalf(format string, args ...any) {
	g.log(slog.LevelError, sprintf(format, args))
	g.exit(1)
}

// V reports verbosity level 0 only: grpc's verbose records (level 2 and
// up) are per-RPC detail nobody asked for.
func (g *Logger) V(l int) bool { return l <= 0 }
