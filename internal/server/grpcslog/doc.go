// Package grpcslog routes grpc-go's process-wide log (package grpclog) to
// a *slog.Logger, so that a JSON log stream holds no plain-text lines
// from grpc's transport.
//
// grpclog's default logger shows only errors; this one keeps that at the
// default log level: grpc's errors are slog errors, its info and warning
// records (connection attempts, transport chatter the caller reports in
// its own words) are debug records.
//
//	var grpcLog = grpcslog.New() // discards until Set
//	func init() { grpclog.SetLoggerV2(grpcLog) } // before any grpc call
//	...
//	grpcLog.Set(logger.With("component", "grpc"))
package grpcslog
