// csi-mock-driver runs the Kubernetes e2e suite's mock CSI driver (k8s.io/kubernetes
// test/e2e/storage/drivers/csi-test) as a node plugin, with a minimal registrar of its own: it serves the CSI
// Identity, Controller and Node services on --csi-endpoint and the kubelet plugin registration API
// (pluginregistration.v1) on <--registration-dir>/<driver>-reg.sock, as node-driver-registrar would beside a
// driver. It prints one line per registration status the kubelet reports ("registration: ok" or
// "registration: failed: <error>") and one line per CSI call it answers: "csi: <method> <request as JSON> -> ok"
// or "-> error: <error>".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	name     string
	endpoint string
	versions []string
}

func (r *registrar) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	fmt.Println("registration: GetInfo")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: r.versions,
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(ctx context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		fmt.Println("registration: ok")
	} else {
		fmt.Printf("registration: failed: %s\n", s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// logCalls prints each CSI call and its outcome, so a test sees what the node asked for. The mock publishes an
// ephemeral volume without making its target directory and leaves it when unpublishing; a driver mounts something
// there and unmounts it, so this makes the directory and removes it.
func logCalls(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
	rsp, err := handler(ctx, req)
	if p, ok := req.(interface{ GetTargetPath() string }); ok && err == nil {
		switch info.FullMethod {
		case "/csi.v1.Node/NodePublishVolume":
			_ = os.MkdirAll(p.GetTargetPath(), 0o755)
		case "/csi.v1.Node/NodeUnpublishVolume":
			_ = os.RemoveAll(p.GetTargetPath())
		}
	}
	body, _ := json.Marshal(req)
	if err != nil {
		fmt.Printf("csi: %s %s -> error: %v\n", info.FullMethod, body, err)
	} else {
		fmt.Printf("csi: %s %s -> ok\n", info.FullMethod, body)
	}
	return rsp, err
}

func listen(path string) net.Listener {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return l
}

func main() {
	name := flag.String("name", service.Name, "the CSI driver's name (the mock answers it as its node ID too)")
	endpoint := flag.String("csi-endpoint", "", "the unix socket the CSI services are served on")
	regDir := flag.String("registration-dir", "", "the kubelet's plugins_registry directory; empty: no registration socket")
	attachLimit := flag.Int64("attach-limit", 0, "NodeGetInfo's max_volumes_per_node (0: none)")
	topology := flag.Bool("enable-topology", false, "answer NodeGetInfo with the topology segment "+service.TopologyKey)
	disableAttach := flag.Bool("disable-attach", false, "the driver has no ControllerPublish (CSIDriver attachRequired: false)")
	version := flag.String("supported-version", "1.0.0", "the version GetInfo offers the kubelet")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "--csi-endpoint is required")
		os.Exit(2)
	}

	svc := service.New(service.Config{
		DisableAttach:  *disableAttach,
		DriverName:     *name,
		AttachLimit:    *attachLimit,
		EnableTopology: *topology,
	})
	csiDriver := driver.NewCSIDriver(&driver.CSIDriverServers{Controller: svc, Identity: svc, Node: svc})
	if err := csiDriver.Start(listen(*endpoint), logCalls); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	var reg *grpc.Server
	if *regDir != "" {
		sock := filepath.Join(*regDir, *name+"-reg.sock")
		l := listen(sock)
		reg = grpc.NewServer()
		registerapi.RegisterRegistrationServer(reg, &registrar{name: *name, endpoint: *endpoint, versions: []string{*version}})
		go func() { _ = reg.Serve(l) }()
		defer os.Remove(sock)
	}
	fmt.Println("serving")

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	if reg != nil {
		reg.Stop()
	}
	csiDriver.Stop()
}
