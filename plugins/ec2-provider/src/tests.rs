use super::*;
use std::cell::RefCell;
use std::rc::Rc;

const DESCRIBE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
  <reservationSet>
    <item>
      <reservationId>r-1234567890abcdef0</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-1234567890abcdef0</instanceId>
          <imageId>ami-bff32ccc</imageId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-192-168-1-88.eu-west-1.compute.internal</privateDnsName>
          <dnsName>ec2-54-194-252-215.eu-west-1.compute.amazonaws.com</dnsName>
          <placement><availabilityZone>eu-west-1c</availabilityZone><tenancy>default</tenancy></placement>
          <privateIpAddress>192.168.1.88</privateIpAddress>
          <ipAddress>54.194.252.215</ipAddress>
          <tagSet>
            <item><key>Name</key><value>web-0</value></item>
            <item><key>capstan.dev/machine-uid</key><value>uid-1</value></item>
          </tagSet>
        </item>
      </instancesSet>
    </item>
    <item>
      <reservationId>r-2</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-0b</instanceId>
          <instanceState><code>48</code><name>terminated</name></instanceState>
          <placement><availabilityZone>eu-west-1a</availabilityZone></placement>
        </item>
      </instancesSet>
    </item>
  </reservationSet>
  <nextToken>page-2</nextToken>
</DescribeInstancesResponse>"#;

fn machine(uid: &str, provider_id: Option<&str>) -> Machine {
    Machine {
        name: "web-0".into(),
        namespace: "default".into(),
        uid: uid.into(),
        cluster_name: Some("prod".into()),
        labels: vec![],
        version: None,
        failure_domain: None,
        provider_config: "{}".into(),
        infrastructure_config: None,
        provider_id: provider_id.map(String::from),
    }
}

fn config() -> Ec2Config {
    Ec2Config {
        region: "eu-west-1".into(),
        endpoint: Some("http://127.0.0.1:5000".into()),
        instance_type: "t3.medium".into(),
        image_id: "ami-bff32ccc".into(),
        security_group_ids: vec!["sg-1".into()],
        tags: [("team".to_string(), "platform".to_string())].into(),
        root_volume_size_gib: Some(40),
        ..Default::default()
    }
}

fn response(status: u16, body: &str) -> Response {
    Response {
        status,
        headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

fn error_body(code: &str) -> String {
    format!(
        "<Response><Errors><Error><Code>{code}</Code><Message>details</Message></Error></Errors><RequestID>x</RequestID></Response>"
    )
}

#[test]
fn describe_answers_parse_across_reservations_with_the_next_page() {
    let (instances, next) = parse_instances(DESCRIBE).unwrap();
    assert_eq!(next.as_deref(), Some("page-2"));
    assert_eq!(instances.len(), 2);
    let first = &instances[0];
    assert_eq!(first.id, "i-1234567890abcdef0");
    assert_eq!(first.state, "running");
    assert_eq!(first.tags.get(UID_TAG).map(String::as_str), Some("uid-1"));
    let status = status(first.clone());
    assert_eq!(status.provider_id, "aws:///eu-west-1c/i-1234567890abcdef0");
    assert_eq!(status.state, InstanceState::Running);
    assert_eq!(status.failure_domain.as_deref(), Some("eu-west-1c"));
    let kinds: Vec<_> = status
        .addresses
        .iter()
        .map(|a| (a.kind, a.address.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (AddressKind::InternalIp, "192.168.1.88"),
            (AddressKind::ExternalIp, "54.194.252.215"),
            (
                AddressKind::InternalDns,
                "ip-192-168-1-88.eu-west-1.compute.internal"
            ),
            (
                AddressKind::ExternalDns,
                "ec2-54-194-252-215.eu-west-1.compute.amazonaws.com"
            ),
            (
                AddressKind::Hostname,
                "ip-192-168-1-88.eu-west-1.compute.internal"
            ),
        ]
    );
    assert_eq!(
        self::status(instances[1].clone()).state,
        InstanceState::Terminated
    );
}

#[test]
fn error_codes_map_to_the_contract() {
    let kind = |status: u16, code: &str| match api_error(
        "RunInstances",
        &response(status, &error_body(code)),
        &error_body(code),
    ) {
        PluginError::Transient(t) => format!("transient {}", t.retry_after_ms),
        PluginError::Unauthorized(_) => "unauthorized".into(),
        PluginError::InvalidConfig(m) => {
            assert!(m.contains(code) && m.contains("RunInstances"), "{m}");
            "invalid-config".into()
        }
        PluginError::NotFound(_) => "not-found".into(),
        PluginError::Terminal(m) => {
            assert!(m.contains(code) && m.contains("details"), "{m}");
            "terminal".into()
        }
    };
    assert_eq!(kind(503, "RequestLimitExceeded"), "transient 2000");
    assert_eq!(kind(500, "InsufficientInstanceCapacity"), "transient 10000");
    assert_eq!(kind(401, "AuthFailure"), "unauthorized");
    assert_eq!(kind(403, "UnauthorizedOperation"), "unauthorized");
    assert_eq!(kind(400, "InvalidAMIID.NotFound"), "invalid-config");
    assert_eq!(kind(400, "InvalidParameterValue"), "invalid-config");
    assert_eq!(kind(400, "MissingParameter"), "invalid-config");
    assert_eq!(kind(400, "InvalidInstanceID.NotFound"), "not-found");
    // Quotas pass (a limit increase): retried, slowly, never terminal.
    assert_eq!(kind(400, "VcpuLimitExceeded"), "transient 30000");
    assert_eq!(kind(400, "InstanceLimitExceeded"), "transient 30000");
    assert_eq!(kind(400, "IdempotentParameterMismatch"), "terminal");
    assert_eq!(kind(500, "SomethingNew"), "transient 2000");
    // Not XML at all: the status decides, the body is quoted.
    match api_error(
        "DescribeInstances",
        &response(502, "bad gateway"),
        "bad gateway",
    ) {
        PluginError::Transient(t) => assert!(t.message.contains("bad gateway")),
        other => panic!("{other}"),
    }
}

#[test]
fn run_parameters_carry_the_idempotency_token_and_tags() {
    let p = run_params(&machine("0b3c1c9e-uid", None), &config(), None).unwrap();
    let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("ClientToken"), Some("0b3c1c9e-uid"));
    assert_eq!(get("ImageId"), Some("ami-bff32ccc"));
    assert_eq!(get("InstanceType"), Some("t3.medium"));
    assert_eq!(get("SecurityGroupId.1"), Some("sg-1"));
    assert_eq!(get("BlockDeviceMapping.1.Ebs.VolumeSize"), Some("40"));
    let tags: BTreeMap<&str, &str> = (1..)
        .map_while(|i| {
            Some((
                get(&format!("TagSpecification.1.Tag.{i}.Key"))?,
                get(&format!("TagSpecification.1.Tag.{i}.Value"))?,
            ))
        })
        .collect();
    assert_eq!(tags.get(UID_TAG), Some(&"0b3c1c9e-uid"));
    assert_eq!(tags.get(MACHINE_TAG), Some(&"default/web-0"));
    assert_eq!(tags.get(CLUSTER_TAG), Some(&"prod"));
    assert_eq!(tags.get("team"), Some(&"platform"));
    assert_eq!(tags.get("Name"), Some(&"web-0"));
}

#[test]
fn provider_ids_round_trip_and_foreign_ones_are_refused() {
    assert_eq!(
        instance_id("aws:///us-east-1a/i-0abc123").unwrap(),
        "i-0abc123"
    );
    for bad in [
        "sim://i-1",
        "aws:///us-east-1a/",
        "aws:///us-east-1a/i-../x",
        "aws://us-east-1a/i-1",
    ] {
        assert!(
            matches!(instance_id(bad), Err(PluginError::Terminal(_))),
            "{bad}"
        );
    }
}

#[test]
fn invalid_configs_name_the_field() {
    let field_of = |c: Ec2Config| match validate(&c) {
        Err(PluginError::InvalidConfig(m)) => m.split(':').next().unwrap().to_string(),
        other => panic!("{other:?}"),
    };
    assert!(validate(&config()).is_ok());
    assert_eq!(
        field_of(Ec2Config {
            region: "mars".into(),
            ..config()
        }),
        "region"
    );
    assert_eq!(
        field_of(Ec2Config {
            instance_type: "big".into(),
            ..config()
        }),
        "instanceType"
    );
    assert_eq!(
        field_of(Ec2Config {
            image_id: "i-1".into(),
            ..config()
        }),
        "imageId"
    );
    assert_eq!(
        field_of(Ec2Config {
            subnet_id: Some("vpc-1".into()),
            ..config()
        }),
        "subnetId"
    );
    assert_eq!(
        field_of(Ec2Config {
            security_group_ids: vec!["sg-1".into(), "g".into()],
            ..config()
        }),
        "securityGroupIds[1]"
    );
    assert_eq!(
        field_of(Ec2Config {
            root_volume_size_gib: Some(0),
            ..config()
        }),
        "rootVolumeSizeGiB"
    );
    assert_eq!(
        field_of(Ec2Config {
            endpoint: Some("ec2.local".into()),
            ..config()
        }),
        "endpoint"
    );
    let mut reserved = config();
    reserved
        .tags
        .insert("capstan.dev/machine-uid".into(), "x".into());
    assert_eq!(field_of(reserved), "tags");
}

/// Answers from a script, recording every request's action.
#[derive(Default)]
struct Scripted {
    answers: RefCell<Vec<Response>>,
    actions: RefCell<Vec<String>>,
}

impl HttpClient for &Scripted {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        let body = String::from_utf8_lossy(&request.body).into_owned();
        let action = body
            .split('&')
            .next()
            .unwrap_or("")
            .trim_start_matches("Action=")
            .to_string();
        assert!(body.contains("Version=2016-11-15"), "{body}");
        self.actions.borrow_mut().push(action);
        Ok(self.answers.borrow_mut().remove(0))
    }
}

#[test]
fn create_finds_an_instance_launched_before_a_crash_instead_of_launching_again() {
    let script = Scripted::default();
    // Two pages: the second is empty.
    script.answers.borrow_mut().extend([
        response(200, DESCRIBE),
        response(
            200,
            "<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>",
        ),
    ]);
    let provider = Ec2Provider::with_client(&script);
    let status = provider
        .live_tagged(&machine("uid-1", None), &config())
        .unwrap()
        .map(self::status)
        .unwrap();
    assert_eq!(status.provider_id, "aws:///eu-west-1c/i-1234567890abcdef0");
    assert_eq!(
        *script.actions.borrow(),
        ["DescribeInstances", "DescribeInstances"]
    );

    // Nothing tagged with the uid yet: launch.
    let empty = "<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>";
    let script = Scripted::default();
    script.answers.borrow_mut().extend([
        response(200, empty),
        response(200, "<RunInstancesResponse><instancesSet><item><instanceId>i-9</instanceId><instanceState><name>pending</name></instanceState><placement><availabilityZone>eu-west-1b</availabilityZone></placement></item></instancesSet></RunInstancesResponse>"),
    ]);
    let provider = Ec2Provider::with_client(&script);
    let launched = provider
        .live_tagged(&machine("uid-2", None), &config())
        .unwrap();
    assert!(launched.is_none());
    let xml = provider
        .call(
            &config(),
            "RunInstances",
            &run_params(&machine("uid-2", None), &config(), None).unwrap(),
        )
        .unwrap();
    let (instances, _) = parse_instances(&xml).unwrap();
    assert_eq!(provider_id(&instances[0]), "aws:///eu-west-1b/i-9");
    assert_eq!(
        *script.actions.borrow(),
        ["DescribeInstances", "RunInstances"]
    );
}

#[test]
fn form_values_are_percent_encoded() {
    assert_eq!(
        form_encode("capstan.dev/machine-uid"),
        "capstan.dev%2Fmachine-uid"
    );
    assert_eq!(form_encode("a b+c"), "a%20b%2Bc");
}

fn item(id: &str, state: &str, uid: &str, launched: &str) -> String {
    format!(
        "<item><instanceId>{id}</instanceId><instanceState><name>{state}</name></instanceState><placement><availabilityZone>eu-west-1a</availabilityZone></placement><launchTime>{launched}</launchTime><tagSet><item><key>capstan.dev/machine-uid</key><value>{uid}</value></item></tagSet></item>"
    )
}

fn describe(items: &[String]) -> String {
    format!(
        "<DescribeInstancesResponse><reservationSet><item><instancesSet>{}</instancesSet></item></reservationSet></DescribeInstancesResponse>",
        items.concat()
    )
}

const EMPTY: &str = "<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>";
const TERMINATING: &str = "<TerminateInstancesResponse/>";

/// A shared script: the provider trait wants a `Default` client.
#[derive(Default, Clone)]
struct Shared(Rc<Scripted>);

impl std::ops::Deref for Shared {
    type Target = Scripted;
    fn deref(&self) -> &Scripted {
        &self.0
    }
}

impl HttpClient for Shared {
    fn send(&self, request: &Request) -> Result<Response, HttpError> {
        (&*self.0).send(request)
    }
}

fn scripted(answers: Vec<Response>) -> Shared {
    let script = Scripted::default();
    script.answers.borrow_mut().extend(answers);
    Shared(Rc::new(script))
}

#[test]
fn duplicates_under_one_uid_are_terminated_and_the_earliest_kept() {
    let tagged = describe(&[
        item("i-late", "running", "uid-1", "2026-11-23T10:00:05.000Z"),
        item("i-early", "running", "uid-1", "2026-11-23T10:00:01.000Z"),
    ]);
    // create with no provider ID: keeps i-early, terminates i-late.
    let script = scripted(vec![response(200, &tagged), response(200, TERMINATING)]);
    let provider = Ec2Provider::with_client(script.clone());
    let status = provider
        .create(&machine("uid-1", None), &config(), None)
        .unwrap();
    assert_eq!(status.provider_id, "aws:///eu-west-1a/i-early");
    assert_eq!(
        *script.actions.borrow(),
        ["DescribeInstances", "TerminateInstances"]
    );
    // get of i-early: the duplicate is terminated on sight.
    let script = scripted(vec![response(200, &tagged), response(200, TERMINATING)]);
    let provider = Ec2Provider::with_client(script.clone());
    let status = provider
        .get(
            &machine("uid-1", Some("aws:///eu-west-1a/i-early")),
            &config(),
        )
        .unwrap();
    assert_eq!(status.state, InstanceState::Running);
    assert_eq!(
        *script.actions.borrow(),
        ["DescribeInstances", "TerminateInstances"]
    );
}

#[test]
fn an_instance_not_listed_yet_is_transient_and_another_machines_is_refused() {
    let not_found = error_body("InvalidInstanceID.NotFound");
    let script = scripted(vec![response(200, EMPTY), response(400, &not_found)]);
    let provider = Ec2Provider::with_client(script.clone());
    let err = provider
        .get(
            &machine("uid-1", Some("aws:///eu-west-1a/i-new")),
            &config(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::Transient(t) if t.message.contains("eventual consistency")),
        "{err}"
    );
    // A provider ID naming an instance tagged for another machine.
    let other = describe(&[item(
        "i-theirs",
        "running",
        "uid-2",
        "2026-11-23T10:00:00.000Z",
    )]);
    let script = scripted(vec![response(200, EMPTY), response(200, &other)]);
    let provider = Ec2Provider::with_client(script.clone());
    let err = provider
        .get(
            &machine("uid-1", Some("aws:///eu-west-1a/i-theirs")),
            &config(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::Terminal(m) if m.contains("carries capstan.dev/machine-uid=uid-2")),
        "{err}"
    );
    // Deleting through it terminates nothing of theirs.
    let script = scripted(vec![response(200, EMPTY), response(200, &other)]);
    let provider = Ec2Provider::with_client(script.clone());
    assert!(
        provider
            .delete(
                &machine("uid-1", Some("aws:///eu-west-1a/i-theirs")),
                &config()
            )
            .is_err()
    );
    assert_eq!(
        *script.actions.borrow(),
        ["DescribeInstances", "DescribeInstances"]
    );
    // Terminated: not found, so the Machine fails and is replaced.
    let gone = describe(&[item(
        "i-old",
        "terminated",
        "uid-1",
        "2026-11-23T10:00:00.000Z",
    )]);
    let script = scripted(vec![response(200, &gone)]);
    let provider = Ec2Provider::with_client(script.clone());
    let err = provider
        .get(
            &machine("uid-1", Some("aws:///eu-west-1a/i-old")),
            &config(),
        )
        .unwrap_err();
    assert!(matches!(err, PluginError::NotFound(_)), "{err}");
}

#[test]
fn delete_is_done_only_when_the_tag_search_finds_no_live_instance() {
    let machine = machine("uid-1", Some("aws:///eu-west-1a/i-a"));
    // The recorded instance not listed yet, a duplicate running: terminate.
    let dup = describe(&[item("i-b", "running", "uid-1", "2026-11-23T10:00:00.000Z")]);
    let not_found = error_body("InvalidInstanceID.NotFound");
    let script = scripted(vec![
        response(200, &dup),
        response(400, &not_found),
        response(200, TERMINATING),
    ]);
    let provider = Ec2Provider::with_client(script.clone());
    assert!(matches!(
        provider.delete(&machine, &config()).unwrap(),
        Deletion::InProgress(2_000)
    ));
    // Shutting down: wait.
    let down = describe(&[
        item("i-a", "shutting-down", "uid-1", "2026-11-23T10:00:00.000Z"),
        item("i-b", "terminated", "uid-1", "2026-11-23T10:00:01.000Z"),
    ]);
    let script = scripted(vec![response(200, &down)]);
    let provider = Ec2Provider::with_client(script.clone());
    assert!(matches!(
        provider.delete(&machine, &config()).unwrap(),
        Deletion::InProgress(5_000)
    ));
    // Every instance terminated: done.
    let done = describe(&[
        item("i-a", "terminated", "uid-1", "2026-11-23T10:00:00.000Z"),
        item("i-b", "terminated", "uid-1", "2026-11-23T10:00:01.000Z"),
    ]);
    let script = scripted(vec![response(200, &done)]);
    let provider = Ec2Provider::with_client(script.clone());
    assert!(matches!(
        provider.delete(&machine, &config()).unwrap(),
        Deletion::Done
    ));
}

#[test]
fn an_idempotency_mismatch_finds_the_running_instance_instead_of_failing() {
    let mismatch = error_body("IdempotentParameterMismatch");
    let running = describe(&[item("i-a", "running", "uid-1", "2026-11-23T10:00:00.000Z")]);
    let script = scripted(vec![
        response(200, EMPTY),
        response(400, &mismatch),
        response(200, &running),
    ]);
    let provider = Ec2Provider::with_client(script.clone());
    let status = provider
        .create(&machine("uid-1", None), &config(), None)
        .unwrap();
    assert_eq!(status.provider_id, "aws:///eu-west-1a/i-a");
    // Not listed yet: transient, tried again.
    let script = scripted(vec![
        response(200, EMPTY),
        response(400, &mismatch),
        response(200, EMPTY),
    ]);
    let provider = Ec2Provider::with_client(script.clone());
    let err = provider
        .create(&machine("uid-1", None), &config(), None)
        .unwrap_err();
    assert!(matches!(err, PluginError::Transient(_)), "{err}");
}

#[test]
fn capacity_is_read_from_describe_instance_types() {
    let answer = r#"<DescribeInstanceTypesResponse><instanceTypeSet>
        <item><instanceType>g4dn.xlarge</instanceType>
          <vCpuInfo><defaultVCpus>4</defaultVCpus></vCpuInfo>
          <memoryInfo><sizeInMiB>16384</sizeInMiB></memoryInfo>
          <gpuInfo><gpus><item><name>T4</name><manufacturer>NVIDIA</manufacturer><count>1</count></item></gpus></gpuInfo>
        </item></instanceTypeSet></DescribeInstanceTypesResponse>"#;
    let script = scripted(vec![response(200, answer)]);
    let provider = Ec2Provider::with_client(script.clone());
    let mut c = config();
    c.instance_type = "g4dn.xlarge".into();
    let capacity = provider.capacity(&c).unwrap().unwrap();
    assert_eq!((capacity.cpu_millis, capacity.memory_mib), (4000, 16384));
    assert_eq!(capacity.gpu_count, Some(1));
    assert_eq!(capacity.gpu_type.as_deref(), Some("nvidia.com/gpu"));
    // A type EC2 does not describe: nothing to say.
    let script = scripted(vec![response(
        200,
        "<DescribeInstanceTypesResponse><instanceTypeSet/></DescribeInstanceTypesResponse>",
    )]);
    let provider = Ec2Provider::with_client(script);
    assert!(provider.capacity(&c).unwrap().is_none());
}
