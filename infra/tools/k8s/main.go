// Command osfleet-k8s is one binary for every program of osfleet's one-machine Kubernetes lab (see
// scripts/build-k8s): each component's main is a single call, so linking them once saves a link per
// component (2-3 GB of RAM and a minute or two each) and the components share one page cache copy.
//
// It runs the component named by the name it was started as (a hard link per component, so that
// /proc/self/exe keeps the name when containerd's shim re-executes itself), or by its first argument.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	_ "time/tzdata"

	"k8s.io/component-base/logs"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"

	"go.etcd.io/etcd/server/v3/etcdmain"

	shimmanager "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	containerd "github.com/containerd/containerd/v2/cmd/containerd/command"
	ctr "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/spf13/pflag"
	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwok "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

var components = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy":              func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubectl": func() int {
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"etcd":       func() int { etcdmain.Main(os.Args); return 0 },
	"containerd": func() int { return runApp("containerd", containerd.App().Run(context.Background(), os.Args)) },
	"ctr":        func() int { return runApp("ctr", ctr.New().Run(context.Background(), os.Args)) },
	"coredns":    func() int { coremain.Run(); return 0 },
	"kwok":       runKwok,
	"containerd-shim-runc-v2": func() int {
		// The shim defines its flags (-version, -id, ...) on Go's global flag set, where another component of
		// this binary already put a -version: it panicked "flag redefined: version" and no pod sandbox started.
		flag.CommandLine = flag.NewFlagSet(os.Args[0], flag.ExitOnError)
		onlyShimPlugins()
		shim.RunShim(context.Background(), shimmanager.NewShimManager("io.containerd.runc.v2"))
		return 0
	},
}

// onlyShimPlugins leaves the shim's task service as the one registered plugin. containerd's own plugins (content
// store, snapshotters, CRI...) are registered in this binary too, and the shim initialises every registered
// plugin: the content store, given no root, failed with `mkdir "": no such file or directory` and no pod sandbox
// started. The shim registers its shutdown and event plugins itself when it runs.
func onlyShimPlugins() {
	keep := registry.Graph(func(r *plugin.Registration) bool {
		return r.Type != plugins.TTRPCPlugin || r.ID != "task"
	})
	registry.Reset()
	for i := range keep {
		registry.Register(&keep[i])
	}
}

// runKwok is cmd/kwok's main: the kwok controller that plays the kubelet of simulated nodes.
func runKwok() int {
	// Kubernetes' verflag registers a non-bool --version in pflag.CommandLine at init, and cobra adds that set to
	// every root command: kwok's own bool --version then fails to parse. kwok needs none of those global flags.
	pflag.CommandLine = pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)
	flags := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flags.ParseErrorsAllowlist.UnknownFlags = true
	flags.Usage = func() {}
	ctx := signals.SetupSignalContext()
	ctx, logger := kwoklog.InitFlags(ctx, flags)
	ctx, err := kwokconfig.InitFlags(ctx, flags)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flags.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		return 1
	}
	command := kwok.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flags)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		return 1
	}
	return 0
}

func runApp(name string, err error) int {
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		name, os.Args = os.Args[1], os.Args[1:]
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "osfleet-k8s: run as one of %v (a link of that name, or the first argument)\n", names)
		os.Exit(2)
	}
	os.Exit(run())
}
