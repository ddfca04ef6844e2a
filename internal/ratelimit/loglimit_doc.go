// Package loglimit bounds how often a repeated event is logged at its
// real level. Refusals a client can provoke at will (a NACK every Envoy
// sends, a flood of bad credentials, callers turned away because a limit
// is reached) would otherwise write one line per call: under attack, the
// log itself becomes the outage. The first lines of a burst keep their
// level, the rest go to Debug, and the caller's metric counts them all,
// so nothing is lost but the noise.
//
//	lim := loglimit.New(loglimit.DefaultEvery, loglimit.DefaultBurst)
//	logger.Log(ctx, lim.Level(slog.LevelWarn), "request refused", "reason", reason)
package ratelimit
