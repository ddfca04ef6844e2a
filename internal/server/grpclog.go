package server

import (
	"log/slog"
	"sync"

	"google.golang.org/grpc/grpclog"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/grpcslog"
)

// grpcLog is grpc-go's process-wide logger. grpclog.SetLoggerV2 must run
// before any grpc call and is not safe beside one, hence init; the
// logger behind it is set later, once flags have chosen the format.
var (
	grpcLog     = grpcslog.New()
	grpcLogOnce sync.Once
)

func init() { grpclog.SetLoggerV2(grpcLog) }

// RouteGRPCLog sends grpc's records through logger, in our format (JSON
// logs had grpc's plain text in them). Like klog, process-wide: the
// first server's or agent's logger takes it.
func RouteGRPCLog(logger *slog.Logger) {
	grpcLogOnce.Do(func() { grpcLog.Set(logger.With(logattr.Component, "grpc")) })
}
