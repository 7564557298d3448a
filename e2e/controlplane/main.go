// Command kvgate-k8s is a multi-call binary holding the Kubernetes control plane
// used by kvgate's e2e tier: kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy, kubectl and an embedded etcd.
//
// Usage:
//
//	kvgate-k8s <apiserver|controller-manager|scheduler|proxy|kubectl|etcd> [flags...]
//
// The subcommand may also be selected by the name the binary is invoked as
// (busybox style): a symlink named "kubectl" or "kube-apiserver" works.
//
// Only the chosen command is constructed: NewAPIServerCommand and the scheduler
// call genericapiserver.SetupSignalContext, which panics when called twice, and
// the components share process-wide globals (feature gates, klog flags, legacy
// metrics registries). Run exactly one component per OS process.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	_ "time/tzdata" // for CronJob time zone support (apiserver, controller-manager)

	"github.com/spf13/cobra"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

type subcommand struct {
	// argv0 is what the component sees as os.Args[0] (its upstream binary name).
	argv0 string
	run   func() int
}

func runCobra(newCmd func() *cobra.Command) func() int {
	return func() int { return cli.Run(newCmd()) }
}

var subcommands = map[string]subcommand{
	"apiserver":          {"kube-apiserver", runCobra(apiserver.NewAPIServerCommand)},
	"controller-manager": {"kube-controller-manager", runCobra(controllermanager.NewControllerManagerCommand)},
	"scheduler": {"kube-scheduler", runCobra(func() *cobra.Command {
		return scheduler.NewSchedulerCommand()
	})},
	"proxy":   {"kube-proxy", runCobra(proxy.NewProxyCommand)},
	"kubectl": {"kubectl", runKubectl},
	"etcd":    {"etcd", runEtcd},
}

// aliases maps upstream binary names to subcommands, for symlink invocation.
var aliases = map[string]string{
	"kube-apiserver":          "apiserver",
	"kube-controller-manager": "controller-manager",
	"kube-scheduler":          "scheduler",
	"kube-proxy":              "proxy",
	"kubectl":                 "kubectl",
	"etcd":                    "etcd",
}

func runKubectl() int {
	// Mirrors k8s.io/kubernetes/cmd/kubectl/kubectl.go.
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func usage() {
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: %s <%s> [flags...]\n", filepath.Base(os.Args[0]), strings.Join(names, "|"))
}

func main() {
	name, ok := aliases[filepath.Base(os.Args[0])]
	args := os.Args[1:]
	if !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		name, args = os.Args[1], os.Args[2:]
		if name == "-h" || name == "--help" || name == "help" {
			usage()
			os.Exit(0)
		}
	}
	sc, found := subcommands[name]
	if !found {
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", name)
		usage()
		os.Exit(2)
	}
	// cobra reads os.Args[1:]; make the process look like the upstream binary.
	os.Args = append([]string{sc.argv0}, args...)
	os.Exit(sc.run())
}
