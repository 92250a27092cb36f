// csi-mock-driver runs the Kubernetes e2e suite's mock CSI driver (k8s.io/kubernetes
// test/e2e/storage/drivers/csi-test) as a node plugin, with a minimal registrar of its own: it serves the CSI
// Identity, Controller and Node services on --csi-endpoint and the kubelet plugin registration API
// (pluginregistration.v1) on <--registration-dir>/<driver>-reg.sock, as node-driver-registrar would beside a
// driver. It prints one line per registration status the kubelet reports ("registration: ok" or
// "registration: failed: <error>") and one line per CSI call it answers: "csi: <method> <request as JSON> -> ok"
// or "-> error: <error>". A block volume is published as a file, kept between publishes.
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

	"github.com/container-storage-interface/spec/lib/go/csi"
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

// blockDir holds the files behind the block volumes the driver publishes, one per volume ID.
var blockDir string

// publishBlock publishes a block volume as a file-backed volume: the target leads to the volume's file
// (<blockDir>/<volume id>, 64 MiB, made on first use; a symlink, as a hard link cannot cross the node's mounts), so
// what one pod writes the next one reads.
func publishBlock(r *csi.NodePublishVolumeRequest) error {
	if err := os.MkdirAll(blockDir, 0o750); err != nil {
		return err
	}
	backing := filepath.Join(blockDir, r.GetVolumeId())
	f, err := os.OpenFile(backing, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	info, err := f.Stat()
	if err == nil && info.Size() == 0 {
		err = f.Truncate(64 << 20)
	}
	f.Close()
	if err != nil {
		return err
	}
	_ = os.RemoveAll(r.GetTargetPath())
	return os.Symlink(backing, r.GetTargetPath())
}

// logCalls prints each CSI call and its outcome, so a test sees what the node asked for. The mock publishes an
// ephemeral volume without making its target directory and leaves it when unpublishing; a driver mounts something
// there and unmounts it, so this makes the directory and removes it. A block volume's target is its file instead
// (publishBlock).
func logCalls(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
	rsp, err := handler(ctx, req)
	if p, ok := req.(interface{ GetTargetPath() string }); ok && err == nil {
		switch info.FullMethod {
		case "/csi.v1.Node/NodePublishVolume":
			if r, ok := req.(*csi.NodePublishVolumeRequest); ok && r.GetVolumeCapability().GetBlock() != nil {
				err = publishBlock(r)
			} else {
				_ = os.MkdirAll(p.GetTargetPath(), 0o755)
			}
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
	blocks := flag.String("block-dir", "", "where the files behind published block volumes are kept (default: blocks/ beside the CSI socket)")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "--csi-endpoint is required")
		os.Exit(2)
	}
	blockDir = *blocks
	if blockDir == "" {
		blockDir = filepath.Join(filepath.Dir(*endpoint), "blocks")
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
