// A second file of the probe: the build stages every file of the module's directory.
export function describe(probe) {
  return `${probe.spec?.message ?? '(none)'} from ${probe.metadata.namespace ?? '(cluster)'}/${probe.metadata.name}`;
}
